#include "tests/daemon/http_probe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>

namespace kvstream::testing {

int HttpConnect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

HttpReply HttpRaw(int port, const std::string& raw, int timeout_ms) {
  HttpReply r;
  int fd = HttpConnect(port);
  if (fd < 0) return r;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto left_ms = [&] {
    return static_cast<int>(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(
               end - std::chrono::steady_clock::now()).count()));
  };
  size_t sent = 0;
  while (sent < raw.size()) {
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, left_ms()) <= 0) break;
    ssize_t n = send(fd, raw.data() + sent, raw.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string in;
  char buf[65536];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, left_ms()) <= 0) break;
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    in.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  const size_t head_end = in.find("\r\n\r\n");
  r.head = in.substr(0, head_end);
  if (head_end != std::string::npos) r.body = in.substr(head_end + 4);
  if (in.rfind("HTTP/1.", 0) == 0 && in.size() > 12) r.status = std::atoi(in.c_str() + 9);
  return r;
}

HttpReply HttpGet(int port, const std::string& path, const std::string& user_password,
                  int timeout_ms) {
  std::string req = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!user_password.empty()) req += "Authorization: Basic " + Base64(user_password) + "\r\n";
  return HttpRaw(port, req + "\r\n", timeout_ms);
}

std::string Base64(const std::string& in) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += k[(v >> s) & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint8_t(in[i]) << 16;
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += k[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

}  // namespace kvstream::testing
