#include "frontend/http_server.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>
#include <variant>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "common/log.h"
#include "daemon/credentials.h"
#include "daemon/daemon_runtime.h"
#include "frontend/openai_protocol.h"
#include "frontend/sse.h"

namespace kvstream::frontend {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = boost::asio::ssl;
using tcp = net::ip::tcp;
namespace v1 = kvstream::v1;
using Call = decode::DecodeServer::Request;

namespace {

class TokenizerText : public TokenText {
 public:
  explicit TokenizerText(const tokenizer::Tokenizer* t) : t_(t) {}
  std::string Text(int32_t id) const override {
    if (t_ != nullptr) {
      auto s = t_->Decode(std::span<const int32_t>(&id, 1), false);
      if (s.ok()) return *s;
    }
    return "token_id:" + std::to_string(id);
  }

 private:
  const tokenizer::Tokenizer* t_;
};

std::string Reason(int status) {
  if (status == 499) return "Client Closed Request";
  return std::string(http::obsolete_reason(static_cast<http::status>(status)));
}

// A whole response with a Content-Length.
std::string RawResponse(int status, std::string_view body, bool keep_alive,
                        std::string_view content_type = "application/json",
                        std::string_view extra_headers = "") {
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + Reason(status) + "\r\n";
  out += "Content-Type: ";
  out += content_type;
  out += "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  out += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  out += extra_headers;
  out += "\r\n";
  out += body;
  return out;
}

constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
constexpr std::string_view kStreamHead =
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    "Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n";

}  // namespace

struct HttpServer::Impl {
  HttpOptions opt;
  decode::DecodeServer* server = nullptr;
  const tokenizer::Tokenizer* tokenizer = nullptr;
  std::function<bool()> ready;
  std::unique_ptr<TokenizerText> token_text;
  net::io_context ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::optional<ssl::context> tls;
  tcp::acceptor acceptor{ioc};
  std::vector<std::thread> threads;
  int port = 0;
  std::string id_prefix;
  std::atomic<uint64_t> next_id{1};
  std::atomic<int> in_flight{0};
  std::atomic<bool> stopping{false};
  std::mutex mu;
  std::condition_variable cv;
  int submitting = 0;                                           // threads inside Submit
  std::unordered_map<uint64_t, std::shared_ptr<Call>> calls;  // running, by session id

  void Accept();
  std::optional<ApiError> Authorize(const http::request<http::string_body>& req) const;
  // The chat's prompt: the template rendered, encoded into g's prompt_tokens.
  std::optional<ApiError> RenderChatPrompt(const ChatRequest& chat, v1::GenerateRequest* g) const;
};

std::optional<ApiError> HttpServer::Impl::RenderChatPrompt(const ChatRequest& chat,
                                                           v1::GenerateRequest* g) const {
  ChatRenderOptions o;
  o.add_generation_prompt = chat.add_generation_prompt;
  auto text = RenderChatJson(*opt.chat_template, chat.messages, o);
  if (!text.ok()) {
    const StatusCode c = text.status().code();
    return ApiError{400, text.status().message(), "invalid_request_error", "messages",
                    c == StatusCode::kNotSupported        ? "chat_template_not_supported"
                    : c == StatusCode::kResourceExhausted ? "chat_template_limit"
                                                          : "chat_template_error"};
  }
  // As apply_chat_template(tokenize=True): the template writes the special tokens itself.
  auto ids = tokenizer->Encode(*text, /*add_special_tokens=*/false);
  if (!ids.ok()) return ApiError{400, "the rendered chat: " + ids.status().message(), "invalid_request_error", "messages", ""};
  if (ids->empty()) return ApiError{400, "the chat template rendered an empty prompt", "invalid_request_error", "messages", ""};
  g->clear_prompt_text();
  *g->mutable_prompt_tokens() = {ids->begin(), ids->end()};
  return std::nullopt;
}

std::optional<ApiError> HttpServer::Impl::Authorize(
    const http::request<http::string_body>& req) const {
  if (opt.open) return std::nullopt;
  const auto it = req.find(http::field::authorization);
  if (it != req.end()) {
    std::string_view v(it->value().data(), it->value().size());
    constexpr std::string_view kBearer = "Bearer ";
    if (v.substr(0, kBearer.size()) == kBearer) {
      v.remove_prefix(kBearer.size());
      if (!opt.client_token.empty() && daemon::ConstantTimeEquals(opt.client_token, v))
        return std::nullopt;
    }
    KV_LOG_WARN << "HTTP " << req.target() << " refused: bad bearer token";
    return ApiError{401, "bearer token not accepted", "invalid_request_error", "", "invalid_api_key"};
  }
  if (tls) return std::nullopt;  // the handshake verified the client certificate
  KV_LOG_WARN << "HTTP " << req.target() << " refused: no credential";
  return ApiError{401, "no credential: send 'Authorization: Bearer <token>'",
                  "invalid_request_error", "", "missing_api_key"};
}

namespace {

template <class Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

  Session(HttpServer::Impl* impl, Stream stream)
      : impl_(impl), stream_(std::move(stream)), sid_(impl->next_id++) {}

  void Run() {
    auto self = this->shared_from_this();
    if constexpr (kTls) {
      beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(30));
      stream_.async_handshake(ssl::stream_base::server, [self](beast::error_code ec) {
        if (ec) return self->Close();
        self->Read();
      });
    } else {
      Read();
    }
  }

 private:
  enum class After { kRead, kClose };

  void Read() {
    parser_.emplace();
    parser_->body_limit(impl_->opt.max_body_bytes);
    beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(120));
    http::async_read_header(stream_, buf_, *parser_,
                            [self = this->shared_from_this()](beast::error_code ec, size_t) {
                              self->OnHeader(ec);
                            });
  }

  // curl sends "Expect: 100-continue" with larger bodies and waits a second for the go-ahead.
  void OnHeader(beast::error_code ec) {
    if (ec) return OnRead(ec);
    if (!beast::iequals(parser_->get()[http::field::expect], "100-continue")) return ReadBody();
    net::async_write(stream_, net::buffer(kContinue),
                     [self = this->shared_from_this()](beast::error_code ec, size_t) {
                       if (ec) return self->Close();
                       self->ReadBody();
                     });
  }

  void ReadBody() {
    http::async_read(stream_, buf_, *parser_,
                     [self = this->shared_from_this()](beast::error_code ec, size_t) {
                       self->OnRead(ec);
                     });
  }

  void OnRead(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::operation_aborted || ec == beast::error::timeout ||
        ec == net::error::connection_reset) {
      return Close();
    }
    if (ec == http::error::body_limit) {
      return Send(RawResponse(413, ErrorBody({413, "the request body is over " + std::to_string(impl_->opt.max_body_bytes) + " bytes", "invalid_request_error", "", ""}), false),
                  After::kClose);
    }
    if (ec) return Send(RawResponse(400, ErrorBody({400, "malformed HTTP request: " + ec.message(), "invalid_request_error", "", ""}), false), After::kClose);
    Handle(parser_->release());
  }

  void SendError(const ApiError& e, bool keep_alive) {
    const std::string extra = e.http_status == 401 ? "WWW-Authenticate: Bearer\r\n" : "";
    Send(RawResponse(e.http_status, ErrorBody(e), keep_alive, "application/json", extra),
         keep_alive ? After::kRead : After::kClose);
  }

  void Handle(http::request<http::string_body> req) {
    std::string_view target(req.target().data(), req.target().size());
    target = target.substr(0, target.find('?'));
    const bool keep = req.keep_alive();
    const auto method = req.method();
    if (target == "/health") {
      if (method != http::verb::get) return NotAllowed(keep);
      return Send(RawResponse(200, R"({"status":"ok"})", keep), After::kRead);
    }
    if (target == "/ready") {
      if (method != http::verb::get) return NotAllowed(keep);
      if (impl_->ready && impl_->ready()) return Send(RawResponse(200, R"({"status":"ready"})", keep), After::kRead);
      return SendError({503, "not ready: no prefill daemon is usable, or the daemon is draining",
                        "service_unavailable", "", ""}, keep);
    }
    const bool models = target == "/v1/models";
    const bool completions = target == "/v1/completions";
    const bool chat = target == "/v1/chat/completions";
    if (!models && !completions && !chat)
      return SendError({404, "no such path: " + std::string(target), "invalid_request_error", "", "not_found"}, keep);
    if (auto e = impl_->Authorize(req)) return SendError(*e, keep);
    if (models) {
      if (method != http::verb::get) return NotAllowed(keep);
      return Send(RawResponse(200, ModelsBody(impl_->opt.model_id, std::time(nullptr)), keep), After::kRead);
    }
    if (method != http::verb::post) return NotAllowed(keep);
    if (chat) {
      auto parsed = ParseChatRequest(req.body(), impl_->opt.model_id);
      if (auto* e = std::get_if<ApiError>(&parsed)) return SendError(*e, keep);
      if (!impl_->opt.chat_template || impl_->tokenizer == nullptr)
        return SendError({400, "the model '" + impl_->opt.model_id + "' has no chat template (" +
                                   impl_->opt.chat_template_missing + "): use /v1/completions",
                          "invalid_request_error", "model", "chat_template_not_found"}, keep);
      auto c = std::get<ChatRequest>(std::move(parsed));
      CompletionRequest creq = std::move(c.completion);
      return StartCompletion(std::move(creq), std::move(c));
    }
    auto parsed = ParseCompletionRequest(req.body(), impl_->opt.model_id);
    if (auto* e = std::get_if<ApiError>(&parsed)) return SendError(*e, keep);
    StartCompletion(std::get<CompletionRequest>(std::move(parsed)), std::nullopt);
  }

  void NotAllowed(bool keep) {
    SendError({405, "method not allowed on this path", "invalid_request_error", "", ""}, keep);
  }

  // A completion, or a chat (`chat` set: its prompt is rendered off the I/O threads).
  void StartCompletion(CompletionRequest creq, std::optional<ChatRequest> chat) {
    if (impl_->stopping) return SendError({503, "the HTTP endpoint is stopping", "service_unavailable", "", ""}, false);
    stream_mode_ = creq.stream;
    include_usage_ = creq.include_usage;
    builder_.emplace((chat ? "chat" : "") + impl_->id_prefix + std::to_string(sid_),
                     int64_t(std::time(nullptr)), impl_->opt.model_id, creq,
                     impl_->token_text.get(), chat.has_value());
    ++impl_->in_flight;
    running_ = true;
    beast::get_lowest_layer(stream_).expires_never();
    Watch();
    auto self = this->shared_from_this();
    std::weak_ptr<Session> weak = self;
    std::function<void()> on_output = [weak] {
      if (auto s = weak.lock()) s->SchedulePump();
    };
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      ++impl_->submitting;
    }
    // Rendering and Submit (which may wait in the admission line): off the I/O threads.
    std::thread([self, g = ToGenerateRequest(creq), chat = std::move(chat),
                 on_output = std::move(on_output)]() mutable {
      HttpServer::Impl* impl = self->impl_;
      std::variant<std::shared_ptr<Call>, ApiError> call;
      std::optional<ApiError> bad;
      if (chat) bad = impl->RenderChatPrompt(*chat, &g);
      if (bad) {
        call = *bad;
      } else {
        auto submitted = impl->server->Submit(g, DeadlineAfterMs(impl->opt.request_timeout_ms),
                                              [self] { return self->gone_.load(); }, std::move(on_output));
        if (submitted.ok()) call = std::move(submitted).value();
        else call = ErrorFromStatus(submitted.status());
      }
      std::vector<int32_t> ids(g.prompt_tokens().begin(), g.prompt_tokens().end());
      net::post(self->stream_.get_executor(), [self, call = std::move(call), ids = std::move(ids)]() mutable {
        self->OnSubmitted(std::move(call), std::move(ids));
      });
      std::lock_guard<std::mutex> lock(impl->mu);
      --impl->submitting;
      impl->cv.notify_all();
    }).detach();
  }

  // Reads while the completion runs: a close (or any error) means the client went away.
  void Watch() {
    stream_.async_read_some(net::buffer(watch_),
                            [self = this->shared_from_this()](beast::error_code ec, size_t) {
                              if (!ec) return self->Watch();
                              self->gone_ = true;
                              if (self->call_ && self->running_)
                                self->impl_->server->Cancel(*self->call_, "the HTTP client closed its connection");
                            });
  }

  void OnSubmitted(std::variant<std::shared_ptr<Call>, ApiError> call, std::vector<int32_t> prompt_ids) {
    if (auto* e = std::get_if<ApiError>(&call)) {
      EndCall();
      return SendError(*e, false);
    }
    call_ = std::get<std::shared_ptr<Call>>(std::move(call));
    prompt_len_ = decode::DecodeServer::PromptLength(*call_);
    builder_->set_prompt_token_ids(std::move(prompt_ids));
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      impl_->calls[sid_] = call_;
    }
    if (gone_ || impl_->stopping) impl_->server->Cancel(*call_, "the HTTP client closed its connection");
    if (stream_mode_) {
      out_ += kStreamHead;
      if (std::string first = builder_->FirstChunk(); !first.empty()) out_ += HttpChunk(SseEvent(first));
    }
    Pump();
  }

  void SchedulePump() {
    if (pump_pending_.exchange(true)) return;
    net::post(stream_.get_executor(), [self = this->shared_from_this()] {
      self->pump_pending_ = false;
      self->Pump();
    });
  }

  void Pump() {
    if (!call_ || !running_) return;
    std::vector<v1::GenerateResponse> msgs;
    Status final;
    const bool done = impl_->server->Take(*call_, &msgs, &final);
    for (const auto& m : msgs) {
      std::string chunk = builder_->Chunk(m);
      if (stream_mode_) out_ += HttpChunk(SseEvent(chunk));
    }
    if (!done) return Flush();
    EndCall();
    if (stream_mode_) {
      if (!final.ok()) out_ += HttpChunk(SseEvent(ErrorBody(ErrorFromStatus(final))));
      if (std::string last = builder_->FinishChunk(); final.ok() && !last.empty())
        out_ += HttpChunk(SseEvent(last));
      if (final.ok() && include_usage_) out_ += HttpChunk(SseEvent(builder_->UsageChunk(prompt_len_)));
      out_ += HttpChunk(kSseDone);
      out_ += kLastChunk;
      return Send("", After::kClose);
    }
    if (!final.ok()) return SendError(ErrorFromStatus(final), false);
    Send(RawResponse(200, builder_->Response(prompt_len_), false), After::kClose);
  }

  void EndCall() {
    if (!running_) return;
    running_ = false;
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      impl_->calls.erase(sid_);
    }
    --impl_->in_flight;
  }

  void Send(std::string bytes, After after) {
    out_ += bytes;
    after_ = after;
    done_writing_ = true;
    Flush();
  }

  void Flush() {
    if (writing_) return;
    if (out_.empty()) {
      if (done_writing_) {
        done_writing_ = false;
        if (after_ == After::kRead) return Read();
        return Close();
      }
      return;
    }
    writing_ = true;
    wbuf_ = std::move(out_);
    out_.clear();
    net::async_write(stream_, net::buffer(wbuf_),
                     [self = this->shared_from_this()](beast::error_code ec, size_t) {
                       self->writing_ = false;
                       if (ec) {
                         self->gone_ = true;
                         if (self->call_ && self->running_)
                           self->impl_->server->Cancel(*self->call_, "writing to the HTTP client failed");
                         return self->Close();
                       }
                       self->Flush();
                     });
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    auto& sock = beast::get_lowest_layer(stream_).socket();
    if constexpr (kTls) {
      beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(2));
      stream_.async_shutdown([self = this->shared_from_this()](beast::error_code) {
        beast::error_code e;
        beast::get_lowest_layer(self->stream_).socket().close(e);
      });
    } else {
      sock.shutdown(tcp::socket::shutdown_send, ec);
      sock.close(ec);
    }
  }

  HttpServer::Impl* impl_;
  Stream stream_;
  const uint64_t sid_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::array<char, 512> watch_{};
  std::string out_, wbuf_;
  bool writing_ = false, done_writing_ = false, closed_ = false;
  After after_ = After::kRead;
  // The completion (on the strand).
  bool stream_mode_ = false, include_usage_ = false, running_ = false;
  std::optional<CompletionBuilder> builder_;
  std::shared_ptr<Call> call_;
  int prompt_len_ = 0;
  std::atomic<bool> gone_{false};
  std::atomic<bool> pump_pending_{false};
};

}  // namespace

void HttpServer::Impl::Accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
    if (!ec) {
      socket.set_option(tcp::no_delay(true), ec);
      if (tls) {
        std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(
            this, beast::ssl_stream<beast::tcp_stream>(beast::tcp_stream(std::move(socket)), *tls))
            ->Run();
      } else {
        std::make_shared<Session<beast::tcp_stream>>(this, beast::tcp_stream(std::move(socket)))->Run();
      }
    } else {
      KV_LOG_WARN << "HTTP accept: " << ec.message();
    }
    Accept();
  });
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::port() const { return impl_->port; }
int HttpServer::in_flight() const { return impl_->in_flight.load(); }

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpOptions& options,
                                                      decode::DecodeServer* server,
                                                      const tokenizer::Tokenizer* tokenizer,
                                                      std::function<bool()> ready) {
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  impl->server = server;
  impl->tokenizer = tokenizer;
  impl->ready = std::move(ready);
  impl->token_text = std::make_unique<TokenizerText>(tokenizer);
  std::random_device rd;
  char prefix[32];
  std::snprintf(prefix, sizeof prefix, "cmpl-%08x%08x-", rd(), rd());
  impl->id_prefix = prefix;
  if (!options.tls_cert.empty()) {
    try {
      impl->tls.emplace(ssl::context::tls_server);
      impl->tls->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                             ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                             ssl::context::no_tlsv1_1);
      impl->tls->use_certificate_chain_file(options.tls_cert);
      impl->tls->use_private_key_file(options.tls_key, ssl::context::pem);
      impl->tls->load_verify_file(options.tls_ca);
      impl->tls->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
    } catch (const std::exception& e) {
      return InvalidArgument(std::string("http: TLS setup from tls_cert/tls_key/tls_ca: ") + e.what());
    }
  }
  KV_ASSIGN_OR_RETURN(std::string addr, daemon::ResolveListenAddress(options.listen));
  const size_t colon = addr.rfind(':');
  std::string host = addr.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  beast::error_code ec;
  const auto ip = net::ip::make_address(host.empty() ? "0.0.0.0" : host, ec);
  if (ec) return InvalidArgument("http " + options.listen + ": not an address: " + ec.message());
  int port_num = 0;
  try {
    port_num = std::stoi(addr.substr(colon + 1));
  } catch (...) {
    return InvalidArgument("http " + options.listen + ": no port");
  }
  const tcp::endpoint ep(ip, static_cast<unsigned short>(port_num));
  impl->acceptor.open(ep.protocol(), ec);
  if (!ec) impl->acceptor.bind(ep, ec);
  if (!ec) impl->acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return Unavailable("http: cannot listen on " + addr + ": " + ec.message());
  impl->port = impl->acceptor.local_endpoint().port();
  impl->work.emplace(impl->ioc.get_executor());
  impl->Accept();
  for (int i = 0; i < std::max(1, options.io_threads); ++i)
    impl->threads.emplace_back([p = impl.get()] { p->ioc.run(); });
  KV_LOG_INFO << "HTTP endpoint (OpenAI-compatible) on " << (impl->tls ? "https://" : "http://")
              << host << ":" << impl->port << ", model '" << options.model_id << "'"
              << (options.open ? ", every caller admitted" : ", callers need a credential");
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

void HttpServer::Stop() {
  Impl& s = *impl_;
  if (s.stopping.exchange(true)) return;
  net::post(s.ioc, [&s] {
    beast::error_code ec;
    s.acceptor.close(ec);
  });
  std::unique_lock<std::mutex> lock(s.mu);
  for (auto& [sid, call] : s.calls) s.server->Cancel(*call, "the HTTP endpoint is stopping");
  // Submissions end soon: the decode server's shutdown closed its admission line.
  s.cv.wait_for(lock, std::chrono::seconds(10), [&s] { return s.submitting == 0; });
  lock.unlock();
  // Give the cancelled streams a moment to write their last event.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (s.in_flight > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  s.work.reset();
  s.ioc.stop();
  for (auto& t : s.threads)
    if (t.joinable()) t.join();
  s.threads.clear();
}

}  // namespace kvstream::frontend
