#include "frontend/sse.h"

#include <cstdio>

namespace kvstream::frontend {

std::string SseEvent(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 8);
  size_t start = 0;
  while (true) {
    const size_t nl = data.find('\n', start);
    out += "data: ";
    out += data.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start);
    out += '\n';
    if (nl == std::string_view::npos) break;
    start = nl + 1;
  }
  out += '\n';
  return out;
}

std::string HttpChunk(std::string_view bytes) {
  if (bytes.empty()) return {};
  char size[20];
  std::snprintf(size, sizeof size, "%zx\r\n", bytes.size());
  std::string out(size);
  out.append(bytes);
  out += "\r\n";
  return out;
}

}  // namespace kvstream::frontend
