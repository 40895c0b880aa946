// A raw HTTP/1.1 client for tests of the metrics endpoint: well-formed requests and the
// malformed, oversized and idle connections a hostile client makes.
#pragma once

#include <string>

namespace kvstream::testing {

struct HttpReply {
  int status = -1;    // -1: no complete status line (connection refused, closed, timeout)
  std::string body;   // everything after the header
  std::string head;   // status line and headers
};

// Connects to 127.0.0.1:port, sends `raw` exactly, reads until the peer closes or timeout_ms.
HttpReply HttpRaw(int port, const std::string& raw, int timeout_ms = 5000);
// GET `path` with Connection: close; `user_password` "user:password" adds basic auth.
HttpReply HttpGet(int port, const std::string& path, const std::string& user_password = "",
                  int timeout_ms = 5000);
// A connected socket (-1 on failure); the caller closes it.
int HttpConnect(int port);
std::string Base64(const std::string& in);

}  // namespace kvstream::testing
