// frontend_events: streamed token events per second per core of the HTTP front end on the CPU
// build, the model step excluded (issue 18's target: 20 000).
//
// The server is the decode daemon's real path in this process: frontend::HttpServer (Boost.Beast,
// OpenAI JSON, SSE framing) over decode::DecodeServer (admission, scheduler, per-request text
// streams: the real incremental detokenizer with a real tokenizer), with one substitution: the
// ModelBackend's Forward is a token source that writes nothing and returns, for each sequence, the
// next id of a script (a text encoded with the same tokenizer, so that the detokenized events carry
// real words). Prompts are one token (no prefill, no KV load). The client is another process
// (forked before any thread starts; `kvstream bench serve`'s client, cli/serve/) that keeps
// --streams streaming completions in flight until --requests have run.
//
// Reported: token events the client received, the server process's CPU time over the load
// (getrusage RUSAGE_SELF: every thread of the server, the client excluded), events per second of
// that CPU time (= per core), and its ratio to 20 000. One JSON line on stdout (and --json-out).
//
//   frontend_events [--tokenizer DIR] [--streams 64] [--requests 256] [--max-tokens 256]
//                   [--io-threads 2] [--label L] [--json-out FILE]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <utility>  // before Boost 1.74's awaitable.hpp, which uses std::exchange

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <nlohmann/json.hpp>

#include "cli/serve/dataset.h"
#include "cli/serve/runner.h"
#include "cli/serve/sse_client.h"
#include "common/log.h"
#include "connector/handshake.h"
#include "daemon/daemon_runtime.h"
#include "decode/decode_server.h"
#include "frontend/http_server.h"
#include "tokenizer/tokenizer.h"

using namespace kvstream;
using json = nlohmann::ordered_json;

namespace {

constexpr double kTarget = 20000;

// The model step replaced: sequence s at position p gets script[p % size]; no KV is written.
class TokenSource : public model::ModelBackend {
 public:
  TokenSource(model::ModelConfig config, std::vector<int32_t> script)
      : config_(std::move(config)), script_(std::move(script)) {}
  std::string name() const override { return "token-source"; }
  const model::ModelConfig& config() const override { return config_; }
  Result<std::unique_ptr<model::KvPool>> CreatePool(int, int) override {
    return NotSupported("token-source: the pool comes from the CPU backend");
  }
  Status Forward(model::KvPool&, std::span<const model::SeqInput> batch, model::LayerHooks* hooks,
                 const model::ForwardOptions&, model::ForwardOutput* out) override {
    for (int l = 0; hooks != nullptr && l < config_.num_layers; ++l) {
      KV_RETURN_IF_ERROR(hooks->BeforeAttention(l, nullptr));
      KV_RETURN_IF_ERROR(hooks->AfterLayer(l, nullptr));
    }
    out->next_tokens.clear();
    for (const model::SeqInput& s : batch) {
      const size_t pos = size_t(s.start_pos) + s.tokens.size();
      out->next_tokens.push_back(script_[pos % script_.size()]);
    }
    return OkStatus();
  }

 private:
  model::ModelConfig config_;
  std::vector<int32_t> script_;
};

struct ClientResult {
  int64_t events = 0, completed = 0, failed = 0;
  double seconds = 0;
  char sample[160] = {};  // the text streamed by one request before the load (what events carry)
};

// The child: waits for the port, runs the load, writes a ClientResult back.
int RunClient(int port_fd, int result_fd, int streams, int requests, int max_tokens) {
  int port = 0;
  if (read(port_fd, &port, sizeof port) != sizeof port || port <= 0) return 1;
  using namespace cli::serve;
  auto url = ParseUrl("http://127.0.0.1:" + std::to_string(port));
  boost::asio::io_context io;
  auto client = SseClient::Create(io, *url, ClientOptions{});
  if (!client.ok()) return 1;
  ClientResult out;
  {  // One request first, its streamed text kept as a sample.
    std::string text;
    auto one = [&]() -> boost::asio::awaitable<void> {
      BodyOptions b;
      b.model = "token-source";
      b.ignore_eos = true;
      Conversation c;
      c.ids = true;
      c.turns.push_back(Turn{Message{"", {1}}, 24});
      int len = 0;
      RequestRecord rec;
      Message answer;
      double last = 0;
      co_await (*client)->PostStream("/v1/completions", RequestBody(c, 0, {}, b, &len),
                                     [&](const std::string& data, SteadyTime) { ApplyEvent(data, 0, false, rec, answer, last); });
      text = answer.text;
    };
    boost::asio::co_spawn(io, one(), boost::asio::detached);
    io.run();
    std::snprintf(out.sample, sizeof out.sample, "%s", text.c_str());
  }
  std::vector<Conversation> load(requests);
  for (int i = 0; i < requests; ++i) {
    load[i].ids = true;
    load[i].turns.push_back(Turn{Message{"", {int32_t(1 + i % 7)}}, max_tokens});
  }
  LoadOptions o;
  o.request_rate = INFINITY;
  o.max_concurrency = streams;
  o.body.model = "token-source";
  o.body.ignore_eos = true;
  o.body.temperature = 0;
  const LoadResult r = RunLoad(io, Target{client->get(), nullptr}, load, o);
  out.seconds = r.duration_s;
  std::map<std::string, int> errors;
  for (const RequestRecord& x : r.records) {
    out.events += x.chunks;
    (x.ok ? out.completed : out.failed) += 1;
    if (!x.ok) ++errors[x.error];
  }
  for (const auto& [e, n] : errors) std::fprintf(stderr, "frontend_events: %d x %s\n", n, e.c_str());
  return write(result_fd, &out, sizeof out) == sizeof out ? 0 : 1;
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// A text of common words and punctuation, encoded: what the events carry.
std::vector<int32_t> Script(const tokenizer::Tokenizer& tok) {
  std::string text;
  for (int i = 0; i < 8; ++i)
    text += "The quick brown fox jumps over the lazy dog, and then it runs back home again. "
            "Disaggregated serving streams the prompt's KV cache layer by layer; \"tokens\" arrive "
            "one at a time (about 100 per second per stream). Numbers: 3.14159, 2026-12-02, 42%! ";
  auto ids = tok.Encode(text, false);
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> f = {
      {"tokenizer", KVSTREAM_TOKENIZER_DIR}, {"streams", "64"}, {"requests", "256"},
      {"max-tokens", "256"}, {"io-threads", "2"}, {"label", ""}, {"json-out", ""}};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0 || !f.count(a.substr(2)) || i + 1 >= argc) {
      std::fprintf(stderr, "usage: frontend_events [--tokenizer DIR] [--streams N] [--requests N] "
                           "[--max-tokens N] [--io-threads N] [--label L] [--json-out FILE]\n");
      return 2;
    }
    f[a.substr(2)] = argv[++i];
  }
  const int streams = std::stoi(f["streams"]), requests = std::stoi(f["requests"]);
  const int max_tokens = std::stoi(f["max-tokens"]), io_threads = std::stoi(f["io-threads"]);
  if (streams < 1 || requests < 1 || max_tokens < 1 || io_threads < 1) return 2;

  // The client first, before any thread exists in this process.
  int port_pipe[2], result_pipe[2];
  if (pipe(port_pipe) != 0 || pipe(result_pipe) != 0) return 1;
  const pid_t child = fork();
  if (child < 0) return 1;
  if (child == 0) {
    close(port_pipe[1]);
    close(result_pipe[0]);
    _exit(RunClient(port_pipe[0], result_pipe[1], streams, requests, max_tokens));
  }
  close(port_pipe[0]);
  close(result_pipe[1]);
  auto fail = [&](const Status& s) {
    std::fprintf(stderr, "frontend_events: %s\n", s.ToString().c_str());
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    return 1;
  };
  SetLogLevel(LogLevel::kError);

  auto tok = tokenizer::Tokenizer::Load(f["tokenizer"] + "/tokenizer.json");
  if (!tok.ok()) return fail(tok.status());
  const std::vector<int32_t> script = Script(**tok);
  if (script.empty()) return fail(Internal("the script did not encode"));

  // The pool and the model's shape from the CPU backend's tiny preset; its vocabulary the
  // tokenizer's. One block of 16 tokens per 16 positions of every stream, all in flight at once.
  daemon::DaemonConfig cfg;
  cfg.model = "tiny";
  cfg.max_position = max_tokens + 16;
  cfg.pool_blocks = streams * ((max_tokens + 1 + 15) / 16) + 8;
  cfg.max_batch = streams;
  cfg.max_queue = requests;
  cfg.request_timeout_ms = 600000;
  cfg.peer = "127.0.0.1:1";  // never asked: one-token prompts have no KV to load
  auto serving = daemon::LoadServingModel(cfg);
  if (!serving.ok()) return fail(serving.status());
  model::ModelConfig mc = serving->backend->config();
  mc.vocab_size = std::max(mc.vocab_size, (*tok)->vocab_size());
  TokenSource source(mc, script);
  auto transport = daemon::CreateTransportFromConfig(cfg, "decode");
  if (!transport.ok()) return fail(transport.status());
  connector::DecodeConnectorOptions dopt;
  dopt.prefill_address = cfg.peer;
  auto conn = connector::DecodeConnector::Create(dopt, std::move(transport).value(), serving->pool.get(),
                                                 connector::MakeLayoutDescriptor(mc, cfg.block_size));
  if (!conn.ok()) return fail(conn.status());
  decode::DecodeServer server(cfg, &source, serving->pool.get(), {conn->get()});
  server.set_text_support({tok->get(), ""});
  frontend::HttpOptions hopt;
  hopt.listen = "127.0.0.1:0";
  hopt.model_id = "token-source";
  hopt.io_threads = io_threads;
  hopt.chat_template_missing = "not loaded by this benchmark";
  auto http = frontend::HttpServer::Start(hopt, &server, tok->get(), [] { return true; });
  if (!http.ok()) return fail(http.status());

  const double cpu0 = CpuSeconds();
  const int port = (*http)->port();
  if (write(port_pipe[1], &port, sizeof port) != sizeof port) return fail(Internal("writing the port"));
  ClientResult r;
  const bool got = read(result_pipe[0], &r, sizeof r) == sizeof r;
  const double cpu = CpuSeconds() - cpu0;
  int status = 0;
  waitpid(child, &status, 0);
  if (!got) return fail(Internal("the client process failed"));
  server.BeginShutdown();
  (*http)->Stop();
  server.Stop();

  json j;
  j["bench"] = "frontend_events";
  j["label"] = f["label"];
  j["tokenizer"] = f["tokenizer"];
  j["vocab_size"] = (*tok)->vocab_size();
  j["streams"] = streams;
  j["requests"] = requests;
  j["max_tokens"] = max_tokens;
  j["io_threads"] = io_threads;
  j["completed"] = r.completed;
  j["failed"] = r.failed;
  j["sample_text"] = std::string(r.sample);
  j["events"] = r.events;
  j["wall_s"] = r.seconds;
  j["server_cpu_s"] = cpu;
  j["events_per_s_wall"] = r.seconds > 0 ? double(r.events) / r.seconds : 0.0;
  j["server_cores_busy"] = r.seconds > 0 ? cpu / r.seconds : 0.0;
  const double per_core = cpu > 0 ? double(r.events) / cpu : 0.0;
  j["events_per_core_s"] = per_core;
  j["target_events_per_core_s"] = kTarget;
  j["ratio_to_target"] = per_core / kTarget;
  std::printf("%s\n", j.dump().c_str());
  if (!f["json-out"].empty()) std::ofstream(f["json-out"], std::ios::app) << j.dump() << "\n";
  std::fprintf(stderr,
               "frontend_events: %lld events (%lld requests ok, %lld failed) in %.2f s; server CPU %.2f s "
               "(%.2f cores busy): %.0f events/s per core, %.2fx the %.0f target\n",
               (long long)r.events, (long long)r.completed, (long long)r.failed, r.seconds, cpu,
               r.seconds > 0 ? cpu / r.seconds : 0.0, per_core, per_core / kTarget, kTarget);
  return r.failed == 0 && r.completed == requests ? 0 : 1;
}
