// Integration: kvcache/redis_store.h against real redis-server processes (unix sockets in temp
// directories, requirepass, no persistence): round trip, TTL, batched presence, sharding and
// consistent hashing, AUTH (password, ACL user, refusals), erase-everything, verification.
#include "kvcache/redis_store.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>

#include "kvcache/block_codec.h"
#include "tests/kvcache/redis_server.h"

namespace kvstream::kvcache {
namespace {

using testing::RedisServer;

RedisStoreOptions Options(const std::vector<const RedisServer*>& servers) {
  RedisStoreOptions o;
  for (const RedisServer* s : servers) o.servers.push_back("unix:" + s->socket());
  o.auth_file = servers.front()->AuthFile(servers.front()->password());
  o.timeout = std::chrono::milliseconds(2000);
  o.ttl = std::chrono::seconds(600);
  return o;
}

std::unique_ptr<RedisStore> OpenOk(RedisStoreOptions o) {
  auto s = RedisStore::Open(std::move(o));
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

std::string Key(int i) { return "block-" + std::to_string(i); }

std::string Value(int i, size_t n) {
  std::string v(n, '\0');
  std::mt19937 rng(i);
  for (char& c : v) c = static_cast<char>(rng());
  return v;
}

TEST(RedisStore, RoundTripWithTtlAndBinaryValues) {
  RedisServer server;
  auto store = OpenOk(Options({&server}));
  ASSERT_TRUE(store->Probe().ok());
  for (size_t n : {size_t{0}, size_t{1}, size_t{4096}, size_t{3} << 20}) {
    const std::string v = Value(static_cast<int>(n), n);
    ASSERT_TRUE(store->Put(Key(static_cast<int>(n)), v).ok());
    auto got = store->Get(Key(static_cast<int>(n)));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_TRUE(got->has_value());
    EXPECT_EQ(**got, v);
  }
  auto missing = store->Get("absent");
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->has_value());
  const int ttl = std::stoi(server.Cli({"TTL", store->RedisKey(Key(4096))}));
  EXPECT_GT(ttl, 590);
  EXPECT_LE(ttl, 600);
  const RedisStoreStats st = store->stats();
  EXPECT_EQ(st.puts, 4u);
  EXPECT_EQ(st.hits, 4u);
  EXPECT_EQ(st.misses, 1u);
  EXPECT_EQ(st.put_bytes, 0u + 1 + 4096 + (3u << 20));
  EXPECT_EQ(st.get_bytes, st.put_bytes);
  EXPECT_GT(st.bytes_sent, st.put_bytes);
  EXPECT_EQ(st.errors, 0u);
}

TEST(RedisStore, OversizedValueRefused) {
  RedisServer server;
  RedisStoreOptions o = Options({&server});
  o.max_value_bytes = 1000;
  auto store = OpenOk(o);
  EXPECT_EQ(store->Put("k", std::string(1001, 'x')).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(store->Put("k", std::string(1000, 'x')).ok());
}

TEST(RedisStore, BatchedPresenceIsOneRoundTripPerServer) {
  RedisServer server;
  auto store = OpenOk(Options({&server}));
  std::vector<std::string> keys;
  for (int i = 0; i < 500; ++i) {
    keys.push_back(Key(i));
    if (i % 3 == 0) {
      ASSERT_TRUE(store->Put(Key(i), "v").ok());
    }
  }
  Status status;
  const std::vector<bool> present = store->Exists(keys, &status);
  ASSERT_TRUE(status.ok()) << status.ToString();
  for (int i = 0; i < 500; ++i) EXPECT_EQ(present[i], i % 3 == 0) << i;
  EXPECT_EQ(store->stats().exists_present, 167u);
  // One connection (pooled since the puts), one pipeline of 500 EXISTS.
  EXPECT_EQ(store->stats().connects, 1u);
  const std::string info = server.Cli({"INFO", "commandstats"});
  EXPECT_NE(info.find("cmdstat_exists:calls=500,"), std::string::npos) << info;
  EXPECT_TRUE(store->Exists(std::vector<std::string>{}).empty());
}

TEST(RedisStore, ShardsOverTwoServersByConsistentHash) {
  RedisServer a, b;
  auto store = OpenOk(Options({&a, &b}));
  std::vector<std::string> keys;
  std::map<size_t, int> per_shard;
  for (int i = 0; i < 400; ++i) {
    keys.push_back(Key(i));
    per_shard[store->ShardOf(Key(i))]++;
    ASSERT_TRUE(store->Put(Key(i), Value(i, 64)).ok());
  }
  ASSERT_EQ(per_shard.size(), 2u);
  EXPECT_GT(per_shard[0], 120);
  EXPECT_GT(per_shard[1], 120);
  EXPECT_EQ(std::stoi(a.Cli({"DBSIZE"})), per_shard[0]);
  EXPECT_EQ(std::stoi(b.Cli({"DBSIZE"})), per_shard[1]);
  Status status;
  const std::vector<bool> present = store->Exists(keys, &status);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(std::count(present.begin(), present.end(), true), 400);
  for (int i = 0; i < 400; i += 37) {
    auto got = store->Get(Key(i));
    ASSERT_TRUE(got.ok() && got->has_value());
    EXPECT_EQ(**got, Value(i, 64));
  }
}

TEST(RedisStore, AddingAServerMovesFewKeys) {
  // Open() does not dial: the ring alone is compared.
  RedisStoreOptions o;
  o.insecure = true;
  o.servers = {"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"};
  auto three = OpenOk(o);
  o.servers.push_back("10.0.0.4:6379");
  auto four = OpenOk(o);
  int moved = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const size_t before = three->ShardOf(Key(i)), after = four->ShardOf(Key(i));
    if (before != after) {
      ++moved;
      EXPECT_EQ(after, 3u) << "a key moved between old servers";
    }
  }
  EXPECT_GT(moved, n / 4 - n / 10);  // about 1/4 move, all to the new server
  EXPECT_LT(moved, n / 4 + n / 10);
}

TEST(RedisStore, AuthRequiredUnlessInsecure) {
  RedisStoreOptions o;
  o.servers = {"unix:/nonexistent.sock"};
  auto refused = RedisStore::Open(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("kv_store_auth_file is required"), std::string::npos);
  o.insecure = true;
  EXPECT_TRUE(RedisStore::Open(o).ok());
  o.auth_file = "/nonexistent/auth";
  EXPECT_EQ(RedisStore::Open(o).status().code(), StatusCode::kInvalidArgument);
  for (const std::string bad : {"not a server", "host:0", "host:99999", "[::1:80"}) {
    o.auth_file.clear();
    o.servers = {bad};
    EXPECT_EQ(RedisStore::Open(o).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  o.servers = {"127.0.0.1:6379", "127.0.0.1:6379"};
  EXPECT_EQ(RedisStore::Open(o).status().code(), StatusCode::kInvalidArgument);
  o.servers = {"127.0.0.1:6379"};
  o.ns = "a*b";
  EXPECT_EQ(RedisStore::Open(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(RedisStore, WrongPasswordRefusedWithAClearError) {
  RedisServer server;
  RedisStoreOptions o = Options({&server});
  o.auth_file = server.AuthFile("not-the-password");
  auto store = OpenOk(o);
  const Status st = store->Probe();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("AUTH refused"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find(server.socket()), std::string::npos) << st.ToString();
  EXPECT_EQ(st.message().find("not-the-password"), std::string::npos) << "the password leaked";
  EXPECT_FALSE(store->Put("k", "v").ok());
  // No AUTH at all against a server that requires it: the command's refusal says so.
  o.auth_file.clear();
  o.insecure = true;
  auto open = OpenOk(o);
  const Status noauth = open->Put("k", "v");
  EXPECT_EQ(noauth.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(noauth.message().find("NOAUTH"), std::string::npos) << noauth.ToString();
}

TEST(RedisStore, AclUserAndPassword) {
  RedisServer server("kvstream-test-password",
                     {"--user", "kv", "on", ">kv-user-password", "~kvstream:*", "+@all"});
  RedisStoreOptions o = Options({&server});
  o.auth_file = server.AuthFile("kv-user-password", "kv");
  auto store = OpenOk(o);
  ASSERT_TRUE(store->Probe().ok());
  ASSERT_TRUE(store->Put("k", "v").ok());
  auto got = store->Get("k");
  ASSERT_TRUE(got.ok() && got->has_value());
  o.auth_file = server.AuthFile("wrong", "kv");
  EXPECT_EQ(OpenOk(o)->Probe().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReadRedisAuthFile("k", server.AuthFile("a\nb\nc")).status().code(),
            StatusCode::kInvalidArgument);
  auto creds = ReadRedisAuthFile("k", server.AuthFile(" pw \r", "user"));
  ASSERT_TRUE(creds.ok());
  EXPECT_EQ(creds->user, "user");
  EXPECT_EQ(creds->password, "pw");
}

TEST(RedisStore, EraseAllLeavesForeignKeysAlone) {
  RedisServer a, b;
  auto store = OpenOk(Options({&a, &b}));
  for (int i = 0; i < 3000; ++i) ASSERT_TRUE(store->Put(Key(i), "v").ok());
  for (RedisServer* s : {&a, &b}) {
    s->Cli({"SET", "kvstreamother:x", "1"});
    s->Cli({"SET", "app:kvstream:kv:y", "1"});
    s->Cli({"SET", "foreign", "1"});
  }
  auto erased = store->EraseAll();
  ASSERT_TRUE(erased.ok()) << erased.status().ToString();
  EXPECT_EQ(*erased, 3000u);
  for (RedisServer* s : {&a, &b}) {
    EXPECT_EQ(s->Cli({"DBSIZE"}), "3");
    EXPECT_EQ(s->Cli({"EXISTS", "foreign"}), "1");
    EXPECT_EQ(s->Cli({"EXISTS", "kvstreamother:x"}), "1");
  }
  // Another namespace on the same servers is another kvstream's: untouched.
  RedisStoreOptions o = Options({&a, &b});
  o.ns = "other";
  auto other = OpenOk(o);
  ASSERT_TRUE(other->Put("k", "v").ok());
  ASSERT_TRUE(store->EraseAll().ok());
  EXPECT_TRUE(other->Get("k")->has_value());
}

TEST(RedisStore, EntryThatDoesNotVerifyIsAMiss) {
  RedisServer server;
  RedisStoreOptions o = Options({&server});
  o.verify = [](std::string_view key, std::string_view value) {
    return value == "good:" + std::string(key);
  };
  auto store = OpenOk(o);
  ASSERT_TRUE(store->Put("k1", "good:k1").ok());
  ASSERT_TRUE(store->Get("k1")->has_value());
  server.Cli({"SET", store->RedisKey("k1"), "good:k2"});  // overwritten by someone else
  auto got = store->Get("k1");
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
  EXPECT_EQ(store->stats().verify_failures, 1u);
  EXPECT_EQ(store->stats().misses, 1u);
}

// The tier's real use: codec entries, verified with the cluster secret on the way up. A poisoned
// entry (valid framing and CRC, HMAC made with another secret) planted under the right key reads
// as a miss.
TEST(RedisStore, PoisonedCodecEntryIsAMiss) {
  const std::string secret = "0123456789abcdef-cluster-secret";
  model::KvLayout layout;
  layout.num_layers = 2;
  layout.num_kv_heads = 2;
  layout.head_dim = 8;
  layout.block_size = 4;
  BlockHeader h;
  h.model_hash = 42;
  h.layout = layout;
  h.root = RootKey(h.model_hash, layout, "");
  h.key = BlockKeyOf(h.root, std::vector<int32_t>{5, 6, 7, 8});
  h.tokens = 4;
  std::vector<std::byte> layer(layout.block_bytes(), std::byte{0x5a});
  const std::vector<std::span<const std::byte>> layers(2, std::span<const std::byte>(layer));
  auto entry = [&](const std::string& with) {
    auto e = EncodeBlock(h, layers, with);
    EXPECT_TRUE(e.ok());
    return std::string(reinterpret_cast<const char*>(e->data()), e->size());
  };
  const std::string key(reinterpret_cast<const char*>(h.key.data()), h.key.size());

  RedisServer server;
  RedisStoreOptions o = Options({&server});
  o.verify = [&](std::string_view k, std::string_view v) {
    if (k.size() != h.key.size()) return false;
    BlockKey want;
    std::memcpy(want.data(), k.data(), want.size());
    return DecodeBlock(std::as_bytes(std::span(v.data(), v.size())), {h.root, layout}, &want, secret).ok();
  };
  auto store = OpenOk(o);
  ASSERT_TRUE(store->Put(key, entry(secret)).ok());
  auto good = store->Get(key);
  ASSERT_TRUE(good.ok() && good->has_value());
  EXPECT_EQ(**good, entry(secret));

  RedisStoreOptions attacker = Options({&server});  // reaches the server, lacks the secret
  ASSERT_TRUE(OpenOk(attacker)->Put(key, entry("another-secret-of-16-bytes-or-more")).ok());
  auto poisoned = store->Get(key);
  ASSERT_TRUE(poisoned.ok());
  EXPECT_FALSE(poisoned->has_value());
  std::string damaged = entry(secret);
  damaged[200] ^= 1;
  ASSERT_TRUE(OpenOk(attacker)->Put(key, damaged).ok());
  EXPECT_FALSE(store->Get(key)->has_value());
  EXPECT_EQ(store->stats().verify_failures, 2u);
  EXPECT_EQ(store->stats().hits, 1u);
}

}  // namespace
}  // namespace kvstream::kvcache
