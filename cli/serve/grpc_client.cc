#include "cli/serve/grpc_client.h"

#include <atomic>

#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace kvstream::cli::serve {

namespace asio = boost::asio;
namespace v1 = kvstream::v1;

namespace {

// One Generate stream on gRPC's callback API; OnDone wakes the waiting coroutine on `io`.
class Reader : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  Reader(asio::io_context& io, MessageFn on_message)
      : on_message_(std::move(on_message)), timer_(io, asio::steady_timer::time_point::max()) {}

  void Start(v1::Decode::Stub& stub, std::chrono::milliseconds timeout, const v1::GenerateRequest& req) {
    ctx_.set_deadline(std::chrono::system_clock::now() + timeout);
    stub.async()->Generate(&ctx_, &req, this);
    StartRead(&msg_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended: OnDone follows
    on_message_(msg_, std::chrono::steady_clock::now());
    StartRead(&msg_);
  }
  void OnDone(const grpc::Status& s) override {
    status_ = s;
    asio::post(timer_.get_executor(), [this] {
      done_ = true;
      timer_.cancel();
    });
  }
  asio::awaitable<void> Wait() {
    while (!done_) {
      boost::system::error_code ec;
      co_await timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
  }
  const grpc::Status& status() const { return status_; }

 private:
  MessageFn on_message_;
  grpc::ClientContext ctx_;
  v1::GenerateResponse msg_;
  grpc::Status status_;
  asio::steady_timer timer_;
  bool done_ = false;  // on the io_context
};

const char* CodeName(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "OK";
  }
}

}  // namespace

GrpcClient::GrpcClient(asio::io_context& io, std::shared_ptr<grpc::Channel> channel,
                       std::chrono::milliseconds timeout)
    : io_(io), stub_(v1::Decode::NewStub(std::move(channel))), timeout_(timeout) {}

asio::awaitable<StreamOutcome> GrpcClient::Generate(v1::GenerateRequest req, MessageFn on_message) {
  Reader reader(io_, std::move(on_message));
  reader.Start(*stub_, timeout_, req);
  co_await reader.Wait();
  StreamOutcome out;
  if (!reader.status().ok()) {
    out.error = std::string("grpc ") + CodeName(reader.status().error_code());
    out.body = reader.status().error_message();
  }
  co_return out;
}

v1::GenerateRequest GenerateRequestFor(const Conversation& c, size_t turn,
                                       const std::vector<Message>& answers, const BodyOptions& o,
                                       int* prompt_len) {
  v1::GenerateRequest req;
  Message p = TurnPrompt(c, turn, answers, prompt_len);
  if (c.ids) req.mutable_prompt_tokens()->Add(p.ids.begin(), p.ids.end());
  else req.set_prompt_text(std::move(p.text));
  req.set_max_tokens(c.turns[turn].max_tokens);
  if (o.temperature > 0) req.mutable_sampling()->set_temperature(static_cast<float>(o.temperature));
  req.set_ignore_eos(o.ignore_eos);
  if (o.load_mode == "pipelined") req.set_load_mode(v1::LOAD_MODE_PIPELINED);
  else if (o.load_mode == "non-pipelined") req.set_load_mode(v1::LOAD_MODE_NON_PIPELINED);
  else if (o.load_mode == "local") req.set_load_mode(v1::LOAD_MODE_LOCAL);
  return req;
}

}  // namespace kvstream::cli::serve
