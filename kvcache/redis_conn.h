// One connection to one Redis server with a deadline on every exchange: the transport of the L4
// shared tier (kvcache/redis_store.h is the client). Debian's hiredis 0.14 connects, formats the
// commands and parses the replies; the socket I/O is ours (non-blocking, poll until the
// deadline), so a server that is down, stopped or trickles bytes fails the exchange at the
// deadline, never later.
//
// Guarantees:
//  - Connect() returns by `deadline` (except the DNS lookup of a host name: give an IP address or
//    a unix socket). With credentials it sends AUTH; a refusal is kFailedPrecondition naming the
//    server and the server's reply, never the password.
//  - Run() sends each connection's appended commands as one pipeline and reads one reply per
//    command, all connections at once, by the deadline. A failed connection gets an error status
//    (kTimeout, kRemoteDisconnect, kDataLoss for bytes that are not RESP, nesting past hiredis'
//    depth, an array over kMaxReplyElements or more than max_reply_bytes in one exchange) and is
//    broken(): the caller drops it. Nothing a server sends aborts the process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/time.h"

struct redisContext;
struct redisReader;  // hiredis

namespace kvstream::kvcache {

// "unix:/path", "/path" (a unix socket), "host:port" or "[v6]:port".
struct RedisEndpoint {
  std::string unix_path;
  std::string host;
  int port = 0;
  std::string ToString() const;  // "unix:/path" or "host:port"
};
Result<RedisEndpoint> ParseRedisEndpoint(std::string_view text);

struct RedisCredentials {
  std::string user;      // empty: the default user (AUTH <password>)
  std::string password;  // empty: no AUTH
};

inline constexpr int kMaxReplyElements = 1 << 20;

struct RedisReply {
  enum class Type { kString, kStatus, kError, kInteger, kNil, kArray };
  Type type = Type::kNil;
  std::string str;  // kString, kStatus, kError
  long long integer = 0;
  std::vector<RedisReply> elements;  // kArray
};

// hiredis' reader with reply trees of RedisReply (arrays over kMaxReplyElements refused).
class RedisReplyParser {
 public:
  RedisReplyParser();
  ~RedisReplyParser();
  RedisReplyParser(const RedisReplyParser&) = delete;
  RedisReplyParser& operator=(const RedisReplyParser&) = delete;

  Status Feed(const char* data, size_t size);
  // The next complete reply: true with *out set, false while bytes are missing, kDataLoss for
  // bytes that are not a Redis reply (the parser is then unusable).
  Result<bool> Next(RedisReply* out);
  bool has_buffered() const;  // bytes fed that no returned reply consumed

 private:
  redisReader* reader_;
};

class RedisConn {
 public:
  static Result<std::unique_ptr<RedisConn>> Connect(const RedisEndpoint& endpoint,
                                                    const RedisCredentials& credentials,
                                                    Deadline deadline, size_t max_reply_bytes);
  ~RedisConn();
  RedisConn(const RedisConn&) = delete;
  RedisConn& operator=(const RedisConn&) = delete;

  // Queues one command (its arguments are copied).
  void Append(std::span<const std::string_view> argv);
  // Exchanges every connection's queued commands; afterwards each has status() and replies().
  static void Run(std::span<RedisConn* const> conns, Deadline deadline);

  const Status& status() const { return status_; }
  std::vector<RedisReply>& replies() { return replies_; }
  bool broken() const { return broken_; }
  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t bytes_received() const { return bytes_received_; }

 private:
  RedisConn(redisContext* ctx, std::string name, size_t max_reply_bytes);
  void Fail(Status status);
  void OnWritable();
  void OnReadable();
  bool done() const;

  redisContext* ctx_;
  RedisReplyParser parser_;
  int fd_;
  std::string name_;
  size_t max_reply_bytes_;
  std::string out_;
  size_t out_pos_ = 0;
  size_t expected_ = 0;
  size_t fed_ = 0;
  std::vector<RedisReply> replies_;
  Status status_;
  bool broken_ = false;
  uint64_t bytes_sent_ = 0, bytes_received_ = 0;
};

}  // namespace kvstream::kvcache
