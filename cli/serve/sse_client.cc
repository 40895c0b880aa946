#include "cli/serve/sse_client.h"

#include <openssl/ssl.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include <utility>  // before Boost 1.74's awaitable.hpp, which uses std::exchange

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

namespace kvstream::cli::serve {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

Result<Url> ParseUrl(const std::string& url) {
  Url u;
  std::string rest;
  if (url.rfind("http://", 0) == 0) {
    rest = url.substr(7);
  } else if (url.rfind("https://", 0) == 0) {
    u.https = true;
    rest = url.substr(8);
  } else {
    return InvalidArgument("--url: '" + url + "' is not http://host:port or https://host:port");
  }
  const size_t slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  if (slash != std::string::npos) u.base_path = rest.substr(slash);
  while (!u.base_path.empty() && u.base_path.back() == '/') u.base_path.pop_back();
  if (!hostport.empty() && hostport.front() == '[') {  // [v6]:port
    const size_t close = hostport.find(']');
    if (close == std::string::npos) return InvalidArgument("--url: unbalanced '[' in " + url);
    u.host = hostport.substr(1, close - 1);
    if (close + 1 < hostport.size() && hostport[close + 1] == ':') u.port = hostport.substr(close + 2);
  } else {
    const size_t colon = hostport.rfind(':');
    u.host = hostport.substr(0, colon);
    if (colon != std::string::npos) u.port = hostport.substr(colon + 1);
  }
  if (u.host.empty()) return InvalidArgument("--url: no host in '" + url + "'");
  if (u.port.empty()) u.port = u.https ? "443" : "80";
  if (u.port.find_first_not_of("0123456789") != std::string::npos)
    return InvalidArgument("--url: bad port '" + u.port + "'");
  return u;
}

struct SseClient::Impl {
  asio::io_context& io;
  Url url;
  ClientOptions options;
  tcp::resolver::results_type endpoints;
  std::unique_ptr<ssl::context> tls;

  template <typename Stream>
  asio::awaitable<void> Exchange(Stream& s, http::request<http::string_body>& req,
                                 const EventFn* on_event, StreamOutcome& out, std::string& stage);
  asio::awaitable<StreamOutcome> Run(http::verb verb, std::string path, std::string body,
                                     const EventFn* on_event);
};

SseClient::SseClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SseClient::~SseClient() = default;

Result<std::unique_ptr<SseClient>> SseClient::Create(asio::io_context& io, const Url& url,
                                                     const ClientOptions& options) {
  auto impl = std::unique_ptr<Impl>(new Impl{io, url, options, {}, nullptr});
  beast::error_code ec;
  tcp::resolver resolver(io);
  impl->endpoints = resolver.resolve(url.host, url.port, ec);
  if (ec) return Unavailable("resolving " + url.host + ":" + url.port + ": " + ec.message());
  if (url.https) {
    impl->tls = std::make_unique<ssl::context>(ssl::context::tls_client);
    if (options.tls_ca.empty()) {
      impl->tls->set_default_verify_paths(ec);
    } else {
      impl->tls->load_verify_file(options.tls_ca, ec);
      if (ec) return InvalidArgument("--tls-ca " + options.tls_ca + ": " + ec.message());
    }
    impl->tls->set_verify_mode(ssl::verify_peer);
    if (!options.tls_cert.empty()) {
      impl->tls->use_certificate_chain_file(options.tls_cert, ec);
      if (ec) return InvalidArgument("--tls-cert " + options.tls_cert + ": " + ec.message());
      impl->tls->use_private_key_file(options.tls_key, ssl::context::pem, ec);
      if (ec) return InvalidArgument("--tls-key " + options.tls_key + ": " + ec.message());
    }
  }
  return std::unique_ptr<SseClient>(new SseClient(std::move(impl)));
}

template <typename Stream>
asio::awaitable<void> SseClient::Impl::Exchange(Stream& s, http::request<http::string_body>& req,
                                                const EventFn* on_event, StreamOutcome& out,
                                                std::string& stage) {
  stage = "write";
  co_await http::async_write(s, req, asio::use_awaitable);
  stage = "read";
  beast::flat_buffer buf;
  http::response_parser<http::buffer_body> p;
  p.body_limit(std::numeric_limits<std::uint64_t>::max());  // boost::none: broken in 1.74
  co_await http::async_read_header(s, buf, p, asio::use_awaitable);
  out.http_status = p.get().result_int();
  const bool streaming = on_event != nullptr && out.http_status == 200;
  SseParser sse;
  bool done = false;
  char tmp[16384];
  SteadyTime now;
  auto deliver = [&](const std::string& data) {
    if (data == "[DONE]") done = true;
    else if (!done) (*on_event)(data, now);
  };
  while (!p.is_done() && !done) {
    p.get().body().data = tmp;
    p.get().body().size = sizeof tmp;
    beast::error_code ec;
    co_await http::async_read_some(s, buf, p, asio::redirect_error(asio::use_awaitable, ec));
    if (ec == http::error::need_buffer) ec = {};
    const size_t n = sizeof tmp - p.get().body().size;
    now = std::chrono::steady_clock::now();
    if (streaming) sse.Feed(std::string_view(tmp, n), deliver);
    else out.body.append(tmp, std::min(n, size_t(65536) - std::min(out.body.size(), size_t(65536))));
    if (ec) throw beast::system_error(ec);
  }
  if (streaming && !done) sse.Finish(deliver);
}

asio::awaitable<StreamOutcome> SseClient::Impl::Run(http::verb verb, std::string path,
                                                    std::string body, const EventFn* on_event) {
  StreamOutcome out;
  std::string stage = "connect";
  http::request<http::string_body> req{verb, url.base_path + path, 11};
  req.set(http::field::host, url.host);
  req.set(http::field::user_agent, "kvstream-bench-serve");
  if (verb == http::verb::post) {
    req.set(http::field::content_type, "application/json");
    req.set(http::field::accept, "text/event-stream");
  }
  if (!options.bearer_token.empty()) req.set(http::field::authorization, "Bearer " + options.bearer_token);
  req.body() = std::move(body);
  req.prepare_payload();
  try {
    if (tls) {
      beast::ssl_stream<beast::tcp_stream> s(io, *tls);
      beast::get_lowest_layer(s).expires_after(options.timeout);
      co_await beast::get_lowest_layer(s).async_connect(endpoints, asio::use_awaitable);
      stage = "tls handshake";
      SSL_set_tlsext_host_name(s.native_handle(), url.host.c_str());
      s.set_verify_callback(ssl::host_name_verification(url.host));
      co_await s.async_handshake(ssl::stream_base::client, asio::use_awaitable);
      co_await Exchange(s, req, on_event, out, stage);
      beast::error_code ignored;
      beast::get_lowest_layer(s).socket().shutdown(tcp::socket::shutdown_both, ignored);
    } else {
      beast::tcp_stream s(io);
      s.expires_after(options.timeout);
      co_await s.async_connect(endpoints, asio::use_awaitable);
      co_await Exchange(s, req, on_event, out, stage);
      beast::error_code ignored;
      s.socket().shutdown(tcp::socket::shutdown_both, ignored);
    }
  } catch (const boost::system::system_error& e) {
    if (e.code() == beast::error::timeout) out.error = "timeout (" + stage + ")";
    else if (e.code() == http::error::partial_message || e.code() == http::error::end_of_stream)
      out.error = stage + ": connection closed mid-response";
    else out.error = stage + ": " + e.code().message();
  } catch (const std::exception& e) {
    out.error = stage + ": " + e.what();
  }
  if (out.error.empty() && out.http_status != 200)
    out.error = "http " + std::to_string(out.http_status);
  co_return out;
}

asio::awaitable<StreamOutcome> SseClient::PostStream(std::string path, std::string json_body,
                                                     EventFn on_event) {
  co_return co_await impl_->Run(http::verb::post, std::move(path), std::move(json_body), &on_event);
}

asio::awaitable<StreamOutcome> SseClient::Get(std::string path) {
  co_return co_await impl_->Run(http::verb::get, std::move(path), "", nullptr);
}

}  // namespace kvstream::cli::serve
