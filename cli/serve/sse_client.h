// The HTTP side of `kvstream bench serve` (docs/benchmarks.md): POSTs a JSON body to an
// OpenAI-compatible server and reads its server-sent events as they arrive, on Boost.Beast over
// Asio with C++20 coroutines. Every request is a coroutine on the caller's io_context: no thread
// per request or per stream.
//
// Guarantees:
//  - PostStream never throws: a failure to resolve, connect, handshake, write or read, a status
//    other than 200, a body that is not server-sent events and the per-request deadline all end
//    in StreamOutcome::error (a short reason, counted by kind), with http_status when one came.
//  - on_event is called once per `data:` event other than `[DONE]`, with its payload and the
//    steady-clock time at which the bytes holding it were read (several events read together
//    share that time, as in vLLM's client).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>  // before awaitable.hpp: Boost 1.74 uses std::exchange without it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>

#include "common/status.h"

namespace kvstream::cli::serve {

struct Url {
  bool https = false;
  std::string host;
  std::string port;
  std::string base_path;  // without a trailing '/'
};
// http://host[:port][/path] or https://...; anything else is kInvalidArgument.
Result<Url> ParseUrl(const std::string& url);

struct ClientOptions {
  std::string bearer_token;  // empty: no Authorization header
  std::string tls_ca, tls_cert, tls_key;  // https: the CA to trust (empty: the system's), mTLS
  std::chrono::milliseconds timeout{std::chrono::hours(1)};  // per request, connect to last byte
};

struct StreamOutcome {
  std::string error;     // empty: the stream ended with [DONE] or the end of the body
  int http_status = 0;   // 0: none received
  std::string body;      // a non-200 answer's body (up to 64 KiB)
};

using SteadyTime = std::chrono::steady_clock::time_point;
using EventFn = std::function<void(const std::string& data, SteadyTime at)>;

class SseClient {
 public:
  // Resolves the host once; TLS files are read here (a bad file is kInvalidArgument).
  static Result<std::unique_ptr<SseClient>> Create(boost::asio::io_context& io, const Url& url,
                                                   const ClientOptions& options);
  ~SseClient();
  // POST base_path + path with `json_body`; one connection per request.
  boost::asio::awaitable<StreamOutcome> PostStream(std::string path, std::string json_body,
                                                   EventFn on_event);
  // GET base_path + path, whole body (for /v1/models); status 0 and error set on failure.
  boost::asio::awaitable<StreamOutcome> Get(std::string path);

 private:
  struct Impl;
  explicit SseClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Splits a byte stream into server-sent events (LF or CRLF line ends); Feed returns the `data:`
// payloads of the events completed by `bytes` (multi-line data joined with '\n').
class SseParser {
 public:
  template <typename F>
  void Feed(std::string_view bytes, F&& on_data) {
    buf_.append(bytes.data(), bytes.size());
    size_t start = 0;
    while (true) {
      const size_t nl = buf_.find('\n', start);
      if (nl == std::string::npos) break;
      std::string_view line(buf_.data() + start, nl - start);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      start = nl + 1;
      if (line.empty()) {
        if (has_data_) on_data(data_);
        data_.clear();
        has_data_ = false;
      } else if (line.substr(0, 5) == "data:") {
        line.remove_prefix(5);
        if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
        if (has_data_) data_ += '\n';
        data_.append(line.data(), line.size());
        has_data_ = true;
      }  // comments (':'), event:, id:, retry: ignored
    }
    buf_.erase(0, start);
  }
  // The last event when the body ended without its blank line.
  template <typename F>
  void Finish(F&& on_data) {
    if (!buf_.empty()) Feed("\n", on_data);
    if (has_data_) on_data(data_);
    has_data_ = false;
  }

 private:
  std::string buf_, data_;
  bool has_data_ = false;
};

}  // namespace kvstream::cli::serve
