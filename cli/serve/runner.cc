#include "cli/serve/runner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <limits>
#include <random>

#include <utility>  // before Boost 1.74's awaitable.hpp, which uses std::exchange

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "cli/serve/grpc_client.h"

namespace kvstream::cli::serve {

namespace asio = boost::asio;
using json = nlohmann::json;
namespace v1 = kvstream::v1;
using Clock = std::chrono::steady_clock;

namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Why an error answer failed, from OpenAI's {"error":{...}} or vLLM's {"object":"error",...}.
std::string ErrorKind(const json& j) {
  const json* e = &j;
  if (j.contains("error") && j["error"].is_object()) e = &j["error"];
  for (const char* key : {"code", "type"}) {
    if (!e->contains(key)) continue;
    const json& v = (*e)[key];
    if (v.is_string() && !v.get<std::string>().empty()) return v.get<std::string>();
    if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  }
  if (j.contains("error") && j["error"].is_string()) return j["error"].get<std::string>().substr(0, 80);
  return "";
}

// A counting semaphore for coroutines on one thread: waiters are timers cancelled in turn.
class Slots {
 public:
  Slots(asio::io_context& io, int n) : io_(io), free_(n > 0 ? n : std::numeric_limits<int>::max()) {}
  asio::awaitable<void> Acquire() {
    if (free_ > 0) {
      --free_;
      co_return;
    }
    auto t = std::make_shared<asio::steady_timer>(io_, asio::steady_timer::time_point::max());
    waiters_.push_back(t);
    boost::system::error_code ec;
    co_await t->async_wait(asio::redirect_error(asio::use_awaitable, ec));  // the slot is ours
  }
  void Release() {
    if (waiters_.empty()) {
      ++free_;
      return;
    }
    waiters_.front()->cancel();
    waiters_.pop_front();
  }

 private:
  asio::io_context& io_;
  int free_;
  std::deque<std::shared_ptr<asio::steady_timer>> waiters_;
};

class Progress {
 public:
  Progress(bool on, int total, std::string label) : on_(on), total_(total), label_(std::move(label)) {}
  void Done(bool ok) {
    ++done_;
    failed_ += ok ? 0 : 1;
    const auto now = Clock::now();
    if (on_ && (done_ == total_ || now - drawn_ > std::chrono::milliseconds(100))) Draw(now);
  }
  ~Progress() {
    if (on_ && total_ > 0) std::fputc('\n', stderr);
  }

 private:
  void Draw(Clock::time_point now) {
    drawn_ = now;
    const int width = 30, fill = total_ ? width * done_ / total_ : width;
    std::fprintf(stderr, "\r%s [%s%s] %d/%d failed %d %.1fs", label_.c_str(), std::string(fill, '#').c_str(),
                 std::string(width - fill, '.').c_str(), done_, total_, failed_, Seconds(now - start_));
    std::fflush(stderr);
  }
  const bool on_;
  const int total_;
  const std::string label_;
  int done_ = 0, failed_ = 0;
  const Clock::time_point start_ = Clock::now();
  Clock::time_point drawn_{};
};

// Arrival times (seconds from the start) of n conversations.
std::vector<double> Arrivals(int n, const LoadOptions& o) {
  std::vector<double> at(n, 0.0);
  if (std::isinf(o.request_rate) || n == 0) return at;
  std::mt19937_64 rng(o.seed ^ 0x9e3779b97f4a7c15ull);
  std::gamma_distribution<double> gap(o.burstiness, 1.0 / (o.request_rate * o.burstiness));
  double t = 0;
  for (int i = 0; i < n; ++i) at[i] = t += gap(rng);
  const double scale = at.back() > 0 ? (n / o.request_rate) / at.back() : 1.0;
  for (double& x : at) x *= scale;
  return at;
}

struct Shared {
  asio::io_context& io;
  Target target;
  const LoadOptions& o;
  Slots slots;
  Progress progress;
  Clock::time_point t0;
  Clock::time_point last_end;
};

// Counts a chunk (a streamed event with a choice, or a gRPC message) arriving at `at_s`.
void CountChunk(double at_s, RequestRecord& r, double& last_s) {
  if (r.chunks == 0) r.ttft_s = at_s;
  else r.itl_s.push_back(at_s - last_s);
  last_s = at_s;
  ++r.chunks;
}

asio::awaitable<void> OneRequest(Shared& s, const Conversation& c, size_t turn,
                                 const std::vector<Message>& answers, RequestRecord& r, Message& answer) {
  int prompt_len = 0;
  const bool chat = s.o.body.chat;
  std::string body;
  v1::GenerateRequest greq;
  if (s.target.grpc) greq = GenerateRequestFor(c, turn, answers, s.o.body, &prompt_len);
  else body = RequestBody(c, turn, answers, s.o.body, &prompt_len);
  const Clock::time_point st = Clock::now();
  r.start_s = Seconds(st - s.t0);
  r.prompt_len = prompt_len;
  double last_s = 0;
  std::string stream_error;
  StreamOutcome out;
  if (s.target.grpc) {
    out = co_await s.target.grpc->Generate(std::move(greq), [&](const v1::GenerateResponse& m, SteadyTime at) {
      ApplyMessage(m, Seconds(at - st), r, answer, last_s);
    });
  } else {
    out = co_await s.target.http->PostStream(s.o.path, body, [&](const std::string& data, SteadyTime at) {
      std::string e = ApplyEvent(data, Seconds(at - st), chat, r, answer, last_s);
      if (!e.empty() && stream_error.empty()) stream_error = std::move(e);
    });
  }
  const Clock::time_point end = Clock::now();
  s.last_end = std::max(s.last_end, end);
  if (!out.error.empty()) {
    r.error = out.error;
    if (out.http_status != 0 && out.http_status != 200) {
      const json j = json::parse(out.body, nullptr, false);
      const std::string kind = j.is_discarded() ? "" : ErrorKind(j);
      if (!kind.empty()) r.error += " (" + kind + ")";
    }
  } else if (!stream_error.empty()) {
    r.error = "error event (" + stream_error + ")";
  } else if (r.chunks == 0) {
    r.error = "no chunk with a choice";
  } else {
    r.ok = true;
    r.latency_s = last_s;
    if (!r.usage) r.output_tokens = r.chunks;
  }
}

asio::awaitable<void> RunConversation(Shared& s, const Conversation& c, double arrival_s,
                                      RequestRecord* records) {
  asio::steady_timer timer(s.io, s.t0 + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(arrival_s)));
  boost::system::error_code ec;
  co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  std::vector<Message> answers;
  for (size_t t = 0; t < c.turns.size(); ++t) {
    co_await s.slots.Acquire();
    RequestRecord& r = records[t];
    r.turn = static_cast<int>(t);
    Message answer;
    co_await OneRequest(s, c, t, answers, r, answer);
    s.slots.Release();
    s.progress.Done(r.ok);
    answers.push_back(std::move(answer));
    if (!r.ok) {  // the conversation cannot go on without its answer
      for (size_t u = t + 1; u < c.turns.size(); ++u) {
        records[u].turn = static_cast<int>(u);
        records[u].error = "earlier turn failed";
        s.progress.Done(false);
      }
      break;
    }
  }
}

}  // namespace

std::string ApplyEvent(const std::string& data, double at_s, bool chat, RequestRecord& r,
                       Message& answer, double& last_s) {
  const json j = json::parse(data, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return "event not JSON";
  if (j.contains("error") && !j["error"].is_null()) {
    const std::string kind = ErrorKind(j);
    return kind.empty() ? "error" : kind;
  }
  if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
    CountChunk(at_s, r, last_s);
    const json& c = j["choices"][0];
    const json* text = nullptr;
    if (!chat && c.contains("text")) text = &c["text"];
    if (chat && c.contains("delta") && c["delta"].is_object() && c["delta"].contains("content"))
      text = &c["delta"]["content"];
    if (text && text->is_string()) answer.text += text->get<std::string>();
    if (c.contains("token_ids") && c["token_ids"].is_array())
      for (const json& id : c["token_ids"])
        if (id.is_number_integer()) answer.ids.push_back(id.get<int32_t>());
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    const json& u = j["usage"];
    if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer()) {
      r.output_tokens = u["completion_tokens"].get<int>();
      r.usage = true;
    }
    if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_integer())
      r.prompt_len = u["prompt_tokens"].get<int>();
  }
  return "";
}

void ApplyMessage(const v1::GenerateResponse& msg, double at_s, RequestRecord& r, Message& answer,
                  double& last_s) {
  CountChunk(at_s, r, last_s);
  answer.ids.push_back(msg.token_id());
  answer.text += msg.text();
  r.output_tokens = r.chunks;
  r.usage = true;
}

LoadResult RunLoad(asio::io_context& io, Target target,
                   const std::vector<Conversation>& conversations, const LoadOptions& o) {
  LoadResult result;
  std::vector<size_t> first(conversations.size() + 1, 0);
  for (size_t i = 0; i < conversations.size(); ++i) first[i + 1] = first[i] + conversations[i].turns.size();
  result.records.resize(first.back());
  const std::vector<double> arrivals = Arrivals(static_cast<int>(conversations.size()), o);
  Shared s{io, target, o, Slots(io, o.max_concurrency),
           Progress(o.progress, static_cast<int>(first.back()), o.label), Clock::now(), Clock::now()};
  for (size_t i = 0; i < conversations.size(); ++i)
    asio::co_spawn(io, RunConversation(s, conversations[i], arrivals[i], &result.records[first[i]]),
                   asio::detached);
  io.restart();
  io.run();
  result.duration_s = Seconds(s.last_end - s.t0);
  return result;
}

}  // namespace kvstream::cli::serve
