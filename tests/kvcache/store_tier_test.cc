// Integration: kvcache/store_tier.h (the L4 tier: codec entries in a real redis-server):
// background write-down and verified read-up, blocks already present not rewritten, entries of
// another model / secret / key refused as misses, a full queue dropping blocks, the store down.
#include "kvcache/store_tier.h"

#include <gtest/gtest.h>

#include "tests/kvcache/redis_server.h"

namespace kvstream::kvcache {
namespace {

using testing::RedisServer;
const std::string kSecret = "0123456789abcdef-cluster-secret";

model::KvLayout Layout() {
  model::KvLayout l;
  l.num_layers = 3;
  l.num_kv_heads = 2;
  l.head_dim = 8;
  l.block_size = 4;
  return l;
}

StoreTierOptions Options(const RedisServer& server, uint64_t model = 7,
                         const std::string& secret = kSecret) {
  StoreTierOptions o;
  o.redis.servers = {"unix:" + server.socket()};
  o.redis.auth_file = server.AuthFile(server.password());
  o.redis.timeout = std::chrono::milliseconds(2000);
  o.secret = secret;
  o.model_hash = model;
  o.identity = {RootKey(model, Layout(), ""), Layout()};
  return o;
}

BlockHeader Header(const StoreTierOptions& o, int i) {
  BlockHeader h;
  h.root = o.identity.root;
  h.layout = o.identity.layout;
  h.model_hash = o.model_hash;
  h.key = BlockKeyOf(h.root, std::vector<int32_t>{i, i + 1, i + 2, i + 3});
  h.tokens = 4;
  return h;
}

std::vector<std::byte> Payload(int i) {
  std::vector<std::byte> p(3 * Layout().block_bytes());
  for (size_t j = 0; j < p.size(); ++j) p[j] = static_cast<std::byte>(i * 7 + j);
  return p;
}

TEST(StoreTier, WriteDownThenReadUpVerified) {
  RedisServer server;
  const StoreTierOptions o = Options(server);
  auto tier = StoreTier::Open(o).value();
  std::vector<BlockKey> keys;
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(tier->Write(Header(o, i), Payload(i)));
    keys.push_back(Header(o, i).key);
  }
  ASSERT_TRUE(tier->Flush(DeadlineAfterMs(10000)));
  keys.push_back(Header(o, 99).key);
  const std::vector<bool> present = tier->Present(keys);
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(present[i]);
  EXPECT_FALSE(present[10]);
  for (int i = 0; i < 10; ++i) {
    auto got = tier->Read(keys[i]);
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(*got, Payload(i));
  }
  EXPECT_FALSE(tier->Read(keys[10]).has_value());
  // Written again: found present, not rewritten.
  ASSERT_TRUE(tier->Write(Header(o, 0), Payload(0)));
  ASSERT_TRUE(tier->Flush(DeadlineAfterMs(10000)));
  const StoreTierStats s = tier->stats();
  EXPECT_EQ(s.written_blocks, 10u);
  EXPECT_EQ(s.written_bytes, 10 * EncodedBlockBytes(Layout()));
  EXPECT_EQ(s.skipped_present, 1u);
  EXPECT_EQ(s.read_hits, 10u);
  EXPECT_EQ(s.read_misses, 1u);
  EXPECT_EQ(s.pending_blocks, 0u);
}

TEST(StoreTier, OtherModelSecretOrKeyIsAMiss) {
  RedisServer server;
  const StoreTierOptions o = Options(server);
  auto tier = StoreTier::Open(o).value();
  // Another model's daemon on the same store: its keys differ (the root) and so do its entries.
  const StoreTierOptions other_model = Options(server, 8);
  auto other = StoreTier::Open(other_model).value();
  ASSERT_TRUE(other->Write(Header(other_model, 1), Payload(1)));
  ASSERT_TRUE(other->Flush(DeadlineAfterMs(10000)));
  EXPECT_FALSE(tier->Read(Header(other_model, 1).key).has_value());  // wrong identity
  // Someone with the store's password but not the secret plants an entry under a real key.
  auto forger = StoreTier::Open(Options(server, 7, "another-secret-0123456789")).value();
  ASSERT_TRUE(forger->Write(Header(o, 2), Payload(666)));
  ASSERT_TRUE(forger->Flush(DeadlineAfterMs(10000)));
  EXPECT_TRUE(tier->Present(std::vector<BlockKey>{Header(o, 2).key})[0]);
  EXPECT_FALSE(tier->Read(Header(o, 2).key).has_value());
  EXPECT_EQ(tier->stats().verify_failures, 2u);
  // A layout that is not this tier's is refused at Write.
  BlockHeader h = Header(o, 3);
  h.layout.head_dim = 4;
  EXPECT_FALSE(tier->Write(h, Payload(3)));
  EXPECT_FALSE(tier->Write(Header(o, 3), std::vector<std::byte>(5)));
  EXPECT_EQ(tier->stats().dropped_blocks, 2u);
  EXPECT_EQ(StoreTier::Open(Options(server, 7, "short")).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(StoreTier, FullQueueDropsAndADownStoreIsAMiss) {
  RedisServer server;
  StoreTierOptions o = Options(server);
  o.max_pending_bytes = 2 * Payload(0).size();
  o.redis.timeout = std::chrono::milliseconds(300);
  auto tier = StoreTier::Open(o).value();
  server.Stop();  // the writer hangs on the store until its deadline
  int queued = 0;
  for (int i = 0; i < 20; ++i) queued += tier->Write(Header(o, i), Payload(i)) ? 1 : 0;
  EXPECT_LE(queued, 4);
  EXPECT_GE(tier->stats().dropped_blocks, 16u);
  const auto start = Clock::now();
  EXPECT_FALSE(tier->Read(Header(o, 0).key).has_value());
  EXPECT_LT(SecondsSince(start), 2.0);
  server.Cont();
  EXPECT_TRUE(tier->Flush(DeadlineAfterMs(10000)));
}

}  // namespace
}  // namespace kvstream::kvcache
