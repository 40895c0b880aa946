// Server-sent events over HTTP/1.1 chunked transfer encoding, byte for byte (docs/http.md).
//
// Guarantees:
//  - SseEvent(d) is one event: every line of d as "data: <line>\n", then "\n" (a JSON document
//    from nlohmann's dump has no newline, so it is one "data:" line).
//  - HttpChunk(b) is one chunk of the chunked encoding: hex size, CRLF, b, CRLF; empty b gives
//    nothing (the empty chunk ends the body: kLastChunk).
#pragma once

#include <string>
#include <string_view>

namespace kvstream::frontend {

std::string SseEvent(std::string_view data);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";
std::string HttpChunk(std::string_view bytes);
inline constexpr std::string_view kLastChunk = "0\r\n\r\n";

}  // namespace kvstream::frontend
