#include "kvcache/redis_conn.h"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

namespace kvstream::kvcache {
namespace {

// hiredis builds reply trees through these (redisReplyObjectFunctions): a root is new'd, a child
// lives in its parent's pre-sized vector, so the reader only ever frees roots.
RedisReply* Place(const redisReadTask* task) {
  if (task->parent == nullptr) return new RedisReply();
  auto* parent = static_cast<RedisReply*>(task->parent->obj);
  if (task->idx < 0 || static_cast<size_t>(task->idx) >= parent->elements.size()) return nullptr;
  return &parent->elements[task->idx];
}

void* CreateString(const redisReadTask* task, char* str, size_t len) {
  RedisReply* r = Place(task);
  if (r == nullptr) return nullptr;
  r->type = task->type == REDIS_REPLY_ERROR    ? RedisReply::Type::kError
            : task->type == REDIS_REPLY_STATUS ? RedisReply::Type::kStatus
                                               : RedisReply::Type::kString;
  r->str.assign(str, len);
  return r;
}

void* CreateArray(const redisReadTask* task, int elements) {
  if (elements < 0 || elements > kMaxReplyElements) return nullptr;  // "out of memory"
  RedisReply* r = Place(task);
  if (r == nullptr) return nullptr;
  r->type = RedisReply::Type::kArray;
  r->elements.resize(static_cast<size_t>(elements));
  return r;
}

void* CreateInteger(const redisReadTask* task, long long value) {
  RedisReply* r = Place(task);
  if (r == nullptr) return nullptr;
  r->type = RedisReply::Type::kInteger;
  r->integer = value;
  return r;
}

void* CreateNil(const redisReadTask* task) {
  RedisReply* r = Place(task);
  if (r != nullptr) r->type = RedisReply::Type::kNil;
  return r;
}

void FreeObject(void* root) { delete static_cast<RedisReply*>(root); }

redisReplyObjectFunctions kReplyFunctions = {CreateString, CreateArray, CreateInteger, CreateNil,
                                             FreeObject};

timeval Remaining(Deadline deadline) {
  const auto us = std::max<int64_t>(
      1000, std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now()).count());
  return timeval{static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
}

}  // namespace

std::string RedisEndpoint::ToString() const {
  if (!unix_path.empty()) return "unix:" + unix_path;
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

Result<RedisEndpoint> ParseRedisEndpoint(std::string_view text) {
  RedisEndpoint ep;
  if (text.rfind("unix:", 0) == 0) text.remove_prefix(5);
  if (!text.empty() && text.front() == '/') {
    ep.unix_path = std::string(text);
    return ep;
  }
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0)
    return InvalidArgument("redis server '" + std::string(text) +
                           "': expected host:port or a unix socket path");
  std::string_view host = text.substr(0, colon), port = text.substr(colon + 1);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']')
      return InvalidArgument("redis server '" + std::string(text) + "': bad [IPv6] address");
    host = host.substr(1, host.size() - 2);
  }
  int value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc() || end != port.data() + port.size() || value <= 0 || value > 65535)
    return InvalidArgument("redis server '" + std::string(text) + "': bad port");
  ep.host = std::string(host);
  ep.port = value;
  return ep;
}

RedisReplyParser::RedisReplyParser() : reader_(redisReaderCreateWithFunctions(&kReplyFunctions)) {}

RedisReplyParser::~RedisReplyParser() {
  if (reader_ != nullptr) redisReaderFree(reader_);
}

Status RedisReplyParser::Feed(const char* data, size_t size) {
  if (reader_ == nullptr) return Internal("cannot allocate a reply reader");
  if (redisReaderFeed(reader_, data, size) != REDIS_OK)
    return DataLoss(std::string("reply reader: ") + reader_->errstr);
  return OkStatus();
}

Result<bool> RedisReplyParser::Next(RedisReply* out) {
  if (reader_ == nullptr) return Internal("cannot allocate a reply reader");
  void* reply = nullptr;
  if (redisReaderGetReply(reader_, &reply) != REDIS_OK) {
    const std::string why = reader_->err == REDIS_ERR_OOM
                                ? "an array over " + std::to_string(kMaxReplyElements) +
                                      " elements (or out of memory)"
                                : std::string(reader_->errstr);
    return DataLoss("not a Redis reply: " + why);
  }
  if (reply == nullptr) return false;
  std::unique_ptr<RedisReply> owned(static_cast<RedisReply*>(reply));
  *out = std::move(*owned);
  return true;
}

bool RedisReplyParser::has_buffered() const {
  return reader_ != nullptr && reader_->pos < reader_->len;
}

RedisConn::RedisConn(redisContext* ctx, std::string name, size_t max_reply_bytes)
    : ctx_(ctx),
      fd_(ctx->fd),
      name_(std::move(name)),
      max_reply_bytes_(max_reply_bytes) {}

RedisConn::~RedisConn() { redisFree(ctx_); }  // closes fd_

Result<std::unique_ptr<RedisConn>> RedisConn::Connect(const RedisEndpoint& endpoint,
                                                      const RedisCredentials& credentials,
                                                      Deadline deadline, size_t max_reply_bytes) {
  const std::string name = "redis " + endpoint.ToString();
  if (Expired(deadline)) return Timeout(name + ": no time left to connect");
  redisContext* ctx =
      endpoint.unix_path.empty()
          ? redisConnectWithTimeout(endpoint.host.c_str(), endpoint.port, Remaining(deadline))
          : redisConnectUnixWithTimeout(endpoint.unix_path.c_str(), Remaining(deadline));
  if (ctx == nullptr) return Unavailable(name + ": cannot allocate a connection");
  if (ctx->err != 0) {
    Status st = Unavailable(name + ": connect: " + ctx->errstr);
    redisFree(ctx);
    return st;
  }
  const int flags = fcntl(ctx->fd, F_GETFL, 0);
  if (flags < 0 || fcntl(ctx->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    redisFree(ctx);
    return Internal(name + ": cannot make the socket non-blocking");
  }
  if (endpoint.unix_path.empty()) redisEnableKeepAlive(ctx);
  std::unique_ptr<RedisConn> conn(new RedisConn(ctx, name, max_reply_bytes));
  if (credentials.password.empty()) return conn;

  std::vector<std::string_view> auth = {"AUTH"};
  if (!credentials.user.empty()) auth.push_back(credentials.user);
  auth.push_back(credentials.password);
  conn->Append(auth);
  RedisConn* one[] = {conn.get()};
  Run(one, deadline);
  if (!conn->status().ok()) return conn->status().WithContext("AUTH");
  const RedisReply& reply = conn->replies().front();
  if (reply.type == RedisReply::Type::kError)
    return FailedPrecondition(name + ": AUTH refused (" + reply.str +
                              "): check the user and password of the auth file");
  if (reply.type != RedisReply::Type::kStatus || reply.str != "OK")
    return DataLoss(name + ": unexpected reply to AUTH");
  conn->replies().clear();
  return conn;
}

void RedisConn::Append(std::span<const std::string_view> argv) {
  std::vector<const char*> ptrs;
  std::vector<size_t> lens;
  ptrs.reserve(argv.size());
  lens.reserve(argv.size());
  for (std::string_view a : argv) {
    ptrs.push_back(a.data());
    lens.push_back(a.size());
  }
  char* cmd = nullptr;
  const int n = redisFormatCommandArgv(&cmd, static_cast<int>(argv.size()), ptrs.data(), lens.data());
  if (n < 0 || cmd == nullptr) {
    Fail(Internal(name_ + ": cannot format a command"));
    return;
  }
  out_.append(cmd, static_cast<size_t>(n));
  redisFreeCommand(cmd);
  ++expected_;
}

void RedisConn::Fail(Status status) {
  if (status_.ok()) status_ = std::move(status);
  broken_ = true;
}

bool RedisConn::done() const { return broken_ || replies_.size() >= expected_; }

void RedisConn::OnWritable() {
  while (out_pos_ < out_.size()) {
    const ssize_t n = ::send(fd_, out_.data() + out_pos_, out_.size() - out_pos_, MSG_NOSIGNAL);
    if (n > 0) {
      out_pos_ += static_cast<size_t>(n);
      bytes_sent_ += static_cast<uint64_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    Fail(RemoteDisconnect(name_ + ": send: " + std::strerror(errno)));
    return;
  }
}

void RedisConn::OnReadable() {
  char buf[64 * 1024];
  const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
  if (n == 0) return Fail(RemoteDisconnect(name_ + ": connection closed by the server"));
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
    return Fail(RemoteDisconnect(name_ + ": recv: " + std::strerror(errno)));
  }
  bytes_received_ += static_cast<uint64_t>(n);
  fed_ += static_cast<size_t>(n);
  if (fed_ > max_reply_bytes_)
    return Fail(DataLoss(name_ + ": reply over " + std::to_string(max_reply_bytes_) + " bytes"));
  Status fed = parser_.Feed(buf, static_cast<size_t>(n));
  if (!fed.ok()) return Fail(fed.WithContext(name_));
  while (true) {
    RedisReply reply;
    Result<bool> got = parser_.Next(&reply);
    if (!got.ok()) return Fail(got.status().WithContext(name_));
    if (!*got) return;
    if (replies_.size() >= expected_)
      return Fail(DataLoss(name_ + ": a reply nobody asked for"));
    replies_.push_back(std::move(reply));
  }
}

void RedisConn::Run(std::span<RedisConn* const> conns, Deadline deadline) {
  for (RedisConn* c : conns) {
    c->replies_.clear();
    c->fed_ = 0;
    if (c->broken_ && c->status_.ok()) c->status_ = FailedPrecondition(c->name_ + ": broken");
  }
  std::vector<pollfd> fds;
  std::vector<RedisConn*> live;
  while (true) {
    fds.clear();
    live.clear();
    for (RedisConn* c : conns) {
      if (c->done()) continue;
      short events = POLLIN;
      if (c->out_pos_ < c->out_.size()) events |= POLLOUT;
      fds.push_back(pollfd{c->fd_, events, 0});
      live.push_back(c);
    }
    if (live.empty()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      for (RedisConn* c : live)
        c->Fail(Timeout(c->name_ + ": no reply by the deadline (" +
                        std::to_string(c->replies_.size()) + " of " +
                        std::to_string(c->expected_) + " replies)"));
      break;
    }
    const int rc = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left.count() + 1, 60000)));
    if (rc < 0 && errno != EINTR) {
      for (RedisConn* c : live) c->Fail(Internal(c->name_ + ": poll: " + std::strerror(errno)));
      break;
    }
    for (size_t i = 0; rc > 0 && i < fds.size(); ++i) {
      RedisConn* c = live[i];
      if (fds[i].revents & POLLOUT) c->OnWritable();
      if (!c->broken_ && (fds[i].revents & (POLLIN | POLLHUP | POLLERR))) c->OnReadable();
      if (!c->broken_ && (fds[i].revents & POLLNVAL)) c->Fail(Internal(c->name_ + ": bad socket"));
    }
  }
  for (RedisConn* c : conns) {
    // Bytes beyond the last reply would answer a later command: never reuse such a connection.
    if (!c->broken_ && c->parser_.has_buffered()) c->broken_ = true;
    c->out_.clear();
    c->out_pos_ = 0;
    c->expected_ = 0;
  }
}

}  // namespace kvstream::kvcache
