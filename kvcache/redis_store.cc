#include "kvcache/redis_store.h"

#include <openssl/sha.h>
#include <sys/stat.h>

#include <algorithm>
#include <deque>
#include <fstream>
#include <set>
#include <sstream>

#include "common/log.h"

namespace kvstream::kvcache {

std::vector<std::string> SplitRedisServers(std::string_view list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = list.find(',', start);
    const size_t end = comma == std::string_view::npos ? list.size() : comma;
    if (end > start) out.emplace_back(list.substr(start, end - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

struct RedisStore::Shard {
  RedisEndpoint endpoint;
  std::string name;
  std::mutex mu;
  std::vector<std::unique_ptr<RedisConn>> idle;
  Clock::time_point retry_after{};
  std::chrono::milliseconds backoff{0};
  std::string last_error;
};

// The commands of one call for one server, and what came back.
struct RedisStore::Batch {
  size_t shard = 0;
  std::deque<std::string> owned;  // stable storage for the arguments' views
  std::vector<std::vector<std::string_view>> commands;
  std::vector<size_t> index;  // Exists: the caller's key index of each command
  std::vector<RedisReply> replies;
  Status status;
  bool retry = false;

  std::string_view Own(std::string s) { return owned.emplace_back(std::move(s)); }
};

namespace {

uint64_t Hash64(std::string_view bytes) {
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), md);
  uint64_t h = 0;
  for (int i = 0; i < 8; ++i) h = (h << 8) | md[i];
  return h;
}

std::string Hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

bool ValidNamespace(std::string_view ns) {
  return !ns.empty() && ns.size() <= 64 && std::all_of(ns.begin(), ns.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

std::string Trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

// A reply that must be of `type`; an error reply or another type is a failure of the call.
Status Expect(const RedisReply& reply, RedisReply::Type type, const std::string& server,
              std::string_view what) {
  if (reply.type == type) return OkStatus();
  if (reply.type == RedisReply::Type::kError)
    return FailedPrecondition(server + ": " + std::string(what) + " refused: " + reply.str);
  return DataLoss(server + ": unexpected reply to " + std::string(what));
}

}  // namespace

Result<RedisCredentials> ReadRedisAuthFile(const std::string& key, const std::string& path) {
  std::ifstream in(path);
  if (!in) return InvalidArgument(key + ": cannot read '" + path + "'");
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    KV_LOG_WARN << key << ": '" << path << "' is readable by group or others (chmod 600)";
  }
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    line = Trim(std::move(line));
    if (!line.empty()) lines.push_back(std::move(line));
  }
  RedisCredentials c;
  if (lines.size() == 1) {
    c.password = lines[0];
  } else if (lines.size() == 2) {
    c.user = lines[0];
    c.password = lines[1];
  } else {
    return InvalidArgument(key + ": '" + path +
                           "' must hold one line (the password) or two (ACL user, then password)");
  }
  return c;
}

RedisStore::RedisStore(RedisStoreOptions options) : options_(std::move(options)) {}
RedisStore::~RedisStore() = default;

Result<std::unique_ptr<RedisStore>> RedisStore::Open(RedisStoreOptions options) {
  if (options.servers.empty()) return InvalidArgument("redis store: no server given");
  if (!ValidNamespace(options.ns))
    return InvalidArgument("redis store: namespace '" + options.ns +
                           "' must be 1-64 of [A-Za-z0-9_.-]");
  if (options.timeout.count() <= 0 || options.ttl.count() <= 0 || options.ring_points < 1 ||
      options.backoff_min.count() <= 0 || options.backoff_max < options.backoff_min)
    return InvalidArgument("redis store: timeout, ttl, ring points and backoff must be positive");
  std::unique_ptr<RedisStore> store(new RedisStore(std::move(options)));
  const RedisStoreOptions& o = store->options_;
  if (!o.auth_file.empty()) {
    KV_ASSIGN_OR_RETURN(store->credentials_, ReadRedisAuthFile("kv_store_auth_file", o.auth_file));
  } else if (!o.insecure) {
    return InvalidArgument(
        "redis store: kv_store_auth_file is required (a server without AUTH lets anyone on its "
        "network read and poison the KV); kv_store_insecure=true runs without it");
  }
  std::set<std::string> seen;
  for (const std::string& text : o.servers) {
    KV_ASSIGN_OR_RETURN(RedisEndpoint ep, ParseRedisEndpoint(text));
    if (!seen.insert(ep.ToString()).second)
      return InvalidArgument("redis store: server '" + text + "' given twice");
    auto shard = std::make_unique<Shard>();
    shard->endpoint = ep;
    shard->name = "redis " + ep.ToString();
    shard->backoff = o.backoff_min;
    const uint32_t id = static_cast<uint32_t>(store->shards_.size());
    for (int v = 0; v < o.ring_points; ++v)
      store->ring_.emplace_back(Hash64(ep.ToString() + "#" + std::to_string(v)), id);
    store->endpoints_.push_back(std::move(ep));
    store->shards_.push_back(std::move(shard));
  }
  std::sort(store->ring_.begin(), store->ring_.end());
  return store;
}

size_t RedisStore::ShardOf(std::string_view key) const {
  const uint64_t h = Hash64(key);
  auto it = std::lower_bound(ring_.begin(), ring_.end(), std::make_pair(h, uint32_t{0}));
  if (it == ring_.end()) it = ring_.begin();
  return it->second;
}

std::string RedisStore::RedisKey(std::string_view key) const {
  return options_.ns + ":kv:" + Hex(key);
}

Result<std::unique_ptr<RedisConn>> RedisStore::Acquire(Shard& shard, Deadline deadline,
                                                       bool* reused) {
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    if (!shard.idle.empty()) {
      auto conn = std::move(shard.idle.back());
      shard.idle.pop_back();
      *reused = true;
      return conn;
    }
    const auto now = Clock::now();
    if (now < shard.retry_after) {
      const auto ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(shard.retry_after - now).count();
      return Unavailable(shard.name + ": down (" + shard.last_error + "); next attempt in " +
                         std::to_string(ms) + " ms");
    }
  }
  *reused = false;
  counters_.connects++;
  auto conn = RedisConn::Connect(shard.endpoint, credentials_, deadline,
                                 options_.max_value_bytes + (size_t{1} << 20));
  if (!conn.ok()) {
    counters_.connect_failures++;
    MarkDown(shard, conn.status());
    return conn.status();
  }
  std::lock_guard<std::mutex> lock(shard.mu);
  shard.backoff = options_.backoff_min;
  return conn;
}

void RedisStore::Release(Shard& shard, std::unique_ptr<RedisConn> conn) {
  if (conn == nullptr || conn->broken()) return;
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.idle.size() < options_.max_idle_per_server) shard.idle.push_back(std::move(conn));
}

void RedisStore::MarkDown(Shard& shard, const Status& why) {
  std::lock_guard<std::mutex> lock(shard.mu);
  shard.idle.clear();  // the others were dialled to the same server: likely as dead
  shard.retry_after = Clock::now() + shard.backoff;
  shard.backoff = std::min(shard.backoff * 2, options_.backoff_max);
  shard.last_error = why.message();
  KV_LOG_WARN << "kv store: " << why.ToString() << "; retrying in at least "
              << (shard.retry_after - Clock::now()) / std::chrono::milliseconds(1) << " ms";
}

void RedisStore::RunBatches(std::span<Batch> batches, Deadline deadline) {
  for (Batch& b : batches) b.retry = true;
  // A pooled connection that the server closed while idle (a restart) fails at once: such a
  // batch is tried once more on a fresh connection.
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::vector<Batch*> owners;
    std::vector<std::unique_ptr<RedisConn>> conns;
    std::vector<bool> reused;
    for (Batch& b : batches) {
      if (!b.retry) continue;
      b.retry = false;
      bool was_reused = false;
      auto conn = Acquire(*shards_[b.shard], deadline, &was_reused);
      if (!conn.ok()) {
        b.status = conn.status();
        continue;
      }
      for (const auto& cmd : b.commands) (*conn)->Append(cmd);
      owners.push_back(&b);
      conns.push_back(std::move(conn).value());
      reused.push_back(was_reused);
    }
    if (conns.empty()) break;
    std::vector<RedisConn*> raw;
    std::vector<uint64_t> sent, received;
    for (auto& c : conns) {
      raw.push_back(c.get());
      sent.push_back(c->bytes_sent());
      received.push_back(c->bytes_received());
    }
    RedisConn::Run(raw, deadline);
    bool again = false;
    for (size_t i = 0; i < conns.size(); ++i) {
      Batch& b = *owners[i];
      Shard& shard = *shards_[b.shard];
      counters_.bytes_sent += conns[i]->bytes_sent() - sent[i];
      counters_.bytes_received += conns[i]->bytes_received() - received[i];
      const Status& st = conns[i]->status();
      if (st.ok()) {
        b.status = OkStatus();
        b.replies = std::move(conns[i]->replies());
        Release(shard, std::move(conns[i]));
        continue;
      }
      if (attempt == 0 && reused[i] && st.code() == StatusCode::kRemoteDisconnect &&
          !Expired(deadline)) {
        std::lock_guard<std::mutex> lock(shard.mu);
        shard.idle.clear();
        b.retry = again = true;
        continue;
      }
      b.status = st;
      counters_.errors++;
      if (st.code() == StatusCode::kTimeout) counters_.timeouts++;
      MarkDown(shard, st);
    }
    if (!again) break;
  }
}

Status RedisStore::Probe() {
  Status first;
  for (size_t s = 0; s < shards_.size(); ++s) {
    Batch b;
    b.shard = s;
    b.commands.push_back({"PING"});
    RunBatches(std::span<Batch>(&b, 1), DeadlineAfter(options_.timeout));
    Status st = b.status;
    if (st.ok()) st = Expect(b.replies.at(0), RedisReply::Type::kStatus, shards_[s]->name, "PING");
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

std::vector<bool> RedisStore::Exists(std::span<const std::string> keys, Status* status) {
  counters_.exists_calls++;
  counters_.exists_keys += keys.size();
  std::vector<bool> present(keys.size(), false);
  std::vector<Batch> batches;
  batches.reserve(shards_.size());  // the batches' argument views must not move
  std::vector<int> batch_of(shards_.size(), -1);
  for (size_t i = 0; i < keys.size(); ++i) {
    const size_t s = ShardOf(keys[i]);
    if (batch_of[s] < 0) {
      batch_of[s] = static_cast<int>(batches.size());
      batches.emplace_back().shard = s;
    }
    Batch& b = batches[batch_of[s]];
    b.commands.push_back({"EXISTS", b.Own(RedisKey(keys[i]))});
    b.index.push_back(i);
  }
  RunBatches(batches, DeadlineAfter(options_.timeout));
  Status first;
  for (Batch& b : batches) {
    for (size_t j = 0; b.status.ok() && j < b.replies.size(); ++j) {
      Status st = Expect(b.replies[j], RedisReply::Type::kInteger, shards_[b.shard]->name, "EXISTS");
      if (!st.ok()) {
        b.status = st;
        counters_.errors++;
        for (size_t k = 0; k < j; ++k) present[b.index[k]] = false;
        break;
      }
      present[b.index[j]] = b.replies[j].integer == 1;
    }
    if (!b.status.ok() && first.ok()) first = b.status;
  }
  counters_.exists_present += static_cast<uint64_t>(std::count(present.begin(), present.end(), true));
  if (status != nullptr) *status = first;
  return present;
}

Status RedisStore::Put(std::string_view key, std::string_view value) {
  if (value.size() > options_.max_value_bytes)
    return InvalidArgument("kv store: an entry of " + std::to_string(value.size()) +
                           " bytes is over the limit of " + std::to_string(options_.max_value_bytes));
  counters_.puts++;
  Batch b;
  b.shard = ShardOf(key);
  b.commands.push_back({"SET", b.Own(RedisKey(key)), value, "EX",
                        b.Own(std::to_string(options_.ttl.count()))});
  RunBatches(std::span<Batch>(&b, 1), DeadlineAfter(options_.timeout));
  KV_RETURN_IF_ERROR(b.status);
  Status st = Expect(b.replies.at(0), RedisReply::Type::kStatus, shards_[b.shard]->name, "SET");
  if (!st.ok()) {
    counters_.errors++;
    return st;
  }
  counters_.put_bytes += value.size();
  return OkStatus();
}

Result<std::optional<std::string>> RedisStore::Get(std::string_view key) {
  counters_.gets++;
  Batch b;
  b.shard = ShardOf(key);
  b.commands.push_back({"GET", b.Own(RedisKey(key))});
  RunBatches(std::span<Batch>(&b, 1), DeadlineAfter(options_.timeout));
  KV_RETURN_IF_ERROR(b.status);
  RedisReply& reply = b.replies.at(0);
  if (reply.type == RedisReply::Type::kNil) {
    counters_.misses++;
    return std::optional<std::string>();
  }
  Status st = Expect(reply, RedisReply::Type::kString, shards_[b.shard]->name, "GET");
  if (!st.ok()) {
    counters_.errors++;
    return st;
  }
  counters_.get_bytes += reply.str.size();
  if (options_.verify && !options_.verify(key, reply.str)) {
    counters_.verify_failures++;
    counters_.misses++;
    KV_LOG_WARN << "kv store: the entry " << RedisKey(key) << " on " << shards_[b.shard]->name
                << " does not verify (tampered, or written with another secret): a miss";
    return std::optional<std::string>();
  }
  counters_.hits++;
  return std::optional<std::string>(std::move(reply.str));
}

Result<uint64_t> RedisStore::EraseAll() {
  const std::string pattern = options_.ns + ":*";
  uint64_t erased = 0;
  Status first;
  for (size_t s = 0; s < shards_.size(); ++s) {
    std::string cursor = "0";
    do {
      Batch scan;
      scan.shard = s;
      scan.commands.push_back({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
      RunBatches(std::span<Batch>(&scan, 1), DeadlineAfter(options_.timeout));
      Status st = scan.status;
      const RedisReply* r = st.ok() ? &scan.replies.at(0) : nullptr;
      if (st.ok()) st = Expect(*r, RedisReply::Type::kArray, shards_[s]->name, "SCAN");
      if (st.ok() && (r->elements.size() != 2 || r->elements[0].type != RedisReply::Type::kString ||
                      r->elements[1].type != RedisReply::Type::kArray))
        st = DataLoss(shards_[s]->name + ": malformed SCAN reply");
      if (!st.ok()) {
        if (first.ok()) first = st;
        break;
      }
      cursor = r->elements[0].str;
      Batch unlink;
      unlink.shard = s;
      std::vector<std::string_view> cmd = {"UNLINK"};
      for (const RedisReply& k : r->elements[1].elements)
        if (k.type == RedisReply::Type::kString && k.str.rfind(options_.ns + ":", 0) == 0)
          cmd.push_back(k.str);
      if (cmd.size() == 1) continue;
      unlink.commands.push_back(std::move(cmd));
      RunBatches(std::span<Batch>(&unlink, 1), DeadlineAfter(options_.timeout));
      st = unlink.status;
      if (st.ok()) st = Expect(unlink.replies.at(0), RedisReply::Type::kInteger, shards_[s]->name, "UNLINK");
      if (!st.ok()) {
        if (first.ok()) first = st;
        break;
      }
      erased += static_cast<uint64_t>(std::max(0LL, unlink.replies[0].integer));
    } while (cursor != "0");
  }
  counters_.erased_keys += erased;
  if (!first.ok()) return first;
  return erased;
}

RedisStoreStats RedisStore::stats() const {
  RedisStoreStats s;
  const Counters& c = counters_;
  s.exists_calls = c.exists_calls, s.exists_keys = c.exists_keys, s.exists_present = c.exists_present;
  s.gets = c.gets, s.hits = c.hits, s.misses = c.misses, s.verify_failures = c.verify_failures;
  s.puts = c.puts, s.put_bytes = c.put_bytes, s.get_bytes = c.get_bytes;
  s.erased_keys = c.erased_keys, s.errors = c.errors, s.timeouts = c.timeouts;
  s.connects = c.connects, s.connect_failures = c.connect_failures;
  s.bytes_sent = c.bytes_sent, s.bytes_received = c.bytes_received;
  return s;
}

}  // namespace kvstream::kvcache
