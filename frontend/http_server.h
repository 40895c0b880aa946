// The decode daemon's OpenAI-compatible HTTP endpoint (docs/http.md): Boost.Beast over Asio,
// HTTP/1.1, plaintext or TLS. GET /v1/models, POST /v1/completions and /v1/chat/completions (JSON
// or server-sent events), GET /health (liveness), GET /ready (readiness: the gRPC health status of
// kvstream.v1.Decode).
//
// Guarantees:
//  - A chat's prompt is the checkpoint's chat template rendered (frontend/chat_template.h) and
//    encoded without added special tokens, as transformers' apply_chat_template(tokenize=True);
//    without a template, or when rendering fails, it is a 400 saying why.
//  - Completions go through DecodeServer::Submit, the path of gRPC Generate: the same checks,
//    admission line, scheduler and tokens. An open stream holds no thread: a few I/O threads
//    serve every connection; only a request waiting in the admission line for KV blocks holds a
//    thread (bounded by max_queue: one more is refused at once with 429).
//  - /v1/* need the gRPC API's client credential: "Authorization: Bearer <client token>"
//    (constant-time compare) or, with TLS, the verified client certificate the TLS handshake
//    requires (the gRPC listener's mTLS rule). A bad token is 401 even with a certificate.
//  - A client that closes its connection while its completion runs cancels it (its blocks are
//    released as for a cancelled gRPC call). Completion responses end their connection.
//  - Every error is OpenAI's JSON error shape; input never gives a 500.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "decode/decode_server.h"
#include "frontend/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kvstream::frontend {

struct HttpOptions {
  std::string listen;        // host:port (port 0: pick one)
  std::string model_id;      // the one model /v1/models lists and completions accept
  std::string client_token;  // empty: no token admits (see open)
  bool open = true;          // no credential configured: every caller admitted
  std::string tls_cert, tls_key, tls_ca;  // all set: TLS, client certificate required
  int64_t request_timeout_ms = 600000;
  int io_threads = 2;
  size_t max_body_bytes = 16 << 20;
  // The checkpoint's chat template for /v1/chat/completions; null: chats are refused with 400
  // and chat_template_missing (why there is none).
  std::shared_ptr<const ChatTemplate> chat_template;
  std::string chat_template_missing;
};

class HttpServer {
 public:
  // Binds and starts serving. `server` and `tokenizer` (may be null) must outlive it; `ready`
  // answers /ready.
  static Result<std::unique_ptr<HttpServer>> Start(const HttpOptions& options,
                                                   decode::DecodeServer* server,
                                                   const tokenizer::Tokenizer* tokenizer,
                                                   std::function<bool()> ready);
  ~HttpServer();
  int port() const;
  // Completions not yet ended.
  int in_flight() const;
  // Stops accepting, cancels every completion still running, closes every connection and joins
  // the threads (call before the DecodeServer stops).
  void Stop();

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvstream::frontend
