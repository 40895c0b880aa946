// Fuzzes the L4 tier's reply parser (kvcache::RedisReplyParser: hiredis' reader building
// RedisReply trees, arrays over kMaxReplyElements refused). data[0] picks the chunk size the
// rest is fed in, so replies split across reads are covered too.
#include <cstddef>
#include <cstdint>

#include "kvcache/redis_conn.h"

namespace {

size_t Count(const kvstream::kvcache::RedisReply& r) {
  size_t n = 1;
  for (const auto& e : r.elements) n += Count(e);
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t chunk = 1 + data[0] % 64;
  kvstream::kvcache::RedisReplyParser parser;
  size_t nodes = 0;
  for (size_t off = 1; off < size; off += chunk) {
    const size_t n = size - off < chunk ? size - off : chunk;
    if (!parser.Feed(reinterpret_cast<const char*>(data + off), n).ok()) return 0;
    while (true) {
      kvstream::kvcache::RedisReply reply;
      auto got = parser.Next(&reply);
      if (!got.ok()) return 0;  // not RESP: the connection would be dropped
      if (!*got) break;
      nodes += Count(reply);
    }
  }
  (void)nodes;
  (void)parser.has_buffered();
  return 0;
}
