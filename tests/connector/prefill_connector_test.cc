// PrefillConnector over the in-process fake transport: data lands in the right blocks before
// its notification, failures surface, cancel stops writes for good, stale signals are ignored.
#include "connector/prefill_connector.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "connector/layer_tracker.h"
#include "transport/testing/fake_transport.h"

namespace kvstream::connector {
namespace {

using transport::testing::FakeTransport;

constexpr int kPrefillBlocks = 16;
constexpr int kDecodeBlocks = 32;

model::KvLayout TestLayout() { return model::KvLayout{3, 2, 8, 4, DType::kF16}; }

// A decode instance's session secret (a fixed one per name, kSessionSecretBytes long).
std::string Secret(const std::string& who) {
  std::string s(kSessionSecretBytes, 'x');
  s.replace(0, who.size(), who);
  return s;
}

LayoutDescriptor Descriptor() {
  LayoutDescriptor d;
  d.layout = TestLayout();
  d.model_hash = 0x1234;
  d.model_name = "test";
  return d;
}

std::unique_ptr<model::KvPool> MakePool(int blocks) {
  auto mem = model::AllocateHostPoolMemory(TestLayout().pool_bytes(blocks));
  EXPECT_TRUE(mem.ok());
  return std::make_unique<model::KvPool>(TestLayout(), blocks, std::move(mem).value());
}

// Fills the prefill pool with bytes that encode (layer, block, offset).
void FillPool(model::KvPool& pool) {
  for (int l = 0; l < pool.layout().num_layers; ++l)
    for (int b = 0; b < pool.num_blocks(); ++b) {
      std::byte* p = pool.block_ptr(l, b);
      for (size_t i = 0; i < pool.layout().block_bytes(); ++i)
        p[i] = std::byte(static_cast<uint8_t>(l * 31 + b * 7 + i));
    }
}

class PrefillConnectorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefill_pool_ = MakePool(kPrefillBlocks);
    decode_pool_ = MakePool(kDecodeBlocks);
    FillPool(*prefill_pool_);
    auto w = FakeTransport::Create();
    writer_ = w.get();
    auto r = FakeTransport::Create();
    reader_ = std::move(r);
    reader_->SetNotificationSink([this](const transport::Notification& n) {
      tracker_.OnLanded(n.request_id, n.layer);
    });
    transport::MemoryRegion region{decode_pool_->base(), decode_pool_->memory().size()};
    auto reg = reader_->Register(region);
    ASSERT_TRUE(reg.ok());
    decode_reg_ = std::move(reg).value();
    auto c = PrefillConnector::Create(std::move(w), prefill_pool_.get(), Descriptor());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    connector_ = std::move(c).value();
  }
  void TearDown() override {
    connector_.reset();
    decode_reg_.reset();
    reader_.reset();
  }
  transport::PeerDescriptor Peer() {
    transport::PeerDescriptor p;
    p.address = reader_->LocalAddress();
    p.regions.push_back(transport::RemoteRegion{reinterpret_cast<uint64_t>(decode_pool_->base()),
                                                decode_pool_->memory().size(),
                                                decode_reg_->RemoteKey()});
    return p;
  }
  bool BlockEqual(int layer, int local, int remote) {
    return std::memcmp(prefill_pool_->block_ptr(layer, local), decode_pool_->block_ptr(layer, remote),
                       TestLayout().block_bytes()) == 0;
  }

  std::unique_ptr<model::KvPool> prefill_pool_, decode_pool_;
  FakeTransport* writer_ = nullptr;
  std::unique_ptr<FakeTransport> reader_;
  std::unique_ptr<transport::Registration> decode_reg_;
  std::unique_ptr<PrefillConnector> connector_;
  LayerTracker tracker_;
};

TEST_F(PrefillConnectorTest, SaveLayerLandsEveryBlockThenNotifies) {
  ASSERT_TRUE(connector_->AcceptPeer("d1", Secret("d1"), Descriptor(), Peer(), kDecodeBlocks).ok());
  const std::vector<int32_t> local = {2, 3, 9}, remote = {20, 21, 5};
  auto save = connector_->BeginSave("d1", 42, 10, local, remote);  // 10 tokens = 3 blocks of 4
  ASSERT_TRUE(save.ok()) << save.status().ToString();
  ASSERT_TRUE(tracker_.Begin(42, 3).ok());
  for (int l = 0; l < 3; ++l) {
    ASSERT_TRUE((*save)->SaveLayer(l).ok());
    ASSERT_TRUE(tracker_.WaitForLayer(42, l, DeadlineAfterMs(5000)).ok());
    // The notification came after the data: the layer is complete now.
    for (size_t i = 0; i < local.size(); ++i) EXPECT_TRUE(BlockEqual(l, local[i], remote[i]));
  }
  EXPECT_TRUE((*save)->WaitForSave(DeadlineAfterMs(5000)).ok());
  EXPECT_EQ((*save)->bytes_posted(), 3 * 3 * TestLayout().block_bytes());
  auto layers = (*save)->TakeCompletedLayers();
  EXPECT_EQ(layers, (std::vector<int>{0, 1, 2}));
  connector_->EndSave("d1", 42);
  EXPECT_EQ(connector_->stats().active, 0u);
  // A block that was not a destination is untouched (still zero).
  std::vector<std::byte> zero(TestLayout().block_bytes());
  EXPECT_EQ(std::memcmp(decode_pool_->block_ptr(0, 0), zero.data(), zero.size()), 0);
}

// PrefillRequest.skip_blocks: the first blocks the decode loaded itself are never written; the
// rest land as usual, each layer notified once; a count outside [0, blocks) is refused.
TEST_F(PrefillConnectorTest, SkippedBlocksAreNotWritten) {
  ASSERT_TRUE(connector_->AcceptPeer("d1", Secret("d1"), Descriptor(), Peer(), kDecodeBlocks).ok());
  const std::vector<int32_t> local = {2, 3, 9}, remote = {20, 21, 5};
  for (int skip : {-1, 3, 4}) {
    auto bad = connector_->BeginSave("d1", 40, 10, local, remote, "", skip);
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << skip;
    EXPECT_NE(bad.status().message().find("skip_blocks"), std::string::npos);
  }
  auto save = connector_->BeginSave("d1", 42, 10, local, remote, "", 2);  // 3 blocks of 4
  ASSERT_TRUE(save.ok()) << save.status().ToString();
  ASSERT_TRUE(tracker_.Begin(42, 3).ok());
  for (int l = 0; l < 3; ++l) {
    ASSERT_TRUE((*save)->SaveLayer(l).ok());
    ASSERT_TRUE(tracker_.WaitForLayer(42, l, DeadlineAfterMs(5000)).ok());
    EXPECT_TRUE(BlockEqual(l, 9, 5));
  }
  EXPECT_TRUE((*save)->WaitForSave(DeadlineAfterMs(5000)).ok());
  EXPECT_EQ((*save)->bytes_posted(), 3 * TestLayout().block_bytes());  // one block, 3 layers
  connector_->EndSave("d1", 42);
  // The skipped destinations are untouched (still zero).
  std::vector<std::byte> zero(TestLayout().block_bytes());
  for (int l = 0; l < 3; ++l)
    for (int b : {20, 21}) EXPECT_EQ(std::memcmp(decode_pool_->block_ptr(l, b), zero.data(), zero.size()), 0);
}

TEST_F(PrefillConnectorTest, HandshakeMismatchIsRefusedPerField) {
  LayoutDescriptor d = Descriptor();
  d.layout.block_size = 8;
  Status s = connector_->AcceptPeer("d1", Secret("d1"), d, Peer(), kDecodeBlocks);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("block_size"), std::string::npos);
  d = Descriptor();
  d.layout.dtype = DType::kBF16;
  EXPECT_NE(connector_->AcceptPeer("d1", Secret("d1"), d, Peer(), kDecodeBlocks).message().find("dtype"),
            std::string::npos);
  // A pool region too small for the claimed block count is refused too.
  EXPECT_EQ(connector_->AcceptPeer("d1", Secret("d1"), Descriptor(), Peer(), kDecodeBlocks * 2).code(),
            StatusCode::kInvalidArgument);
  // Without a handshake, requests are refused naming it.
  auto save = connector_->BeginSave("d1", 1, 4, {0}, {0});
  EXPECT_EQ(save.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(save.status().message().find("handshake"), std::string::npos);
}

TEST_F(PrefillConnectorTest, BadBlockIdsAreRefused) {
  ASSERT_TRUE(connector_->AcceptPeer("d1", Secret("d1"), Descriptor(), Peer(), kDecodeBlocks).ok());
  EXPECT_EQ(connector_->BeginSave("d1", 1, 8, {0, 1}, {0, kDecodeBlocks}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(connector_->BeginSave("d1", 1, 8, {0, 1}, {0}).status().code(),
            StatusCode::kInvalidArgument);  // too few for 8 tokens
  EXPECT_EQ(connector_->BeginSave("d1", 1, 0, {0}, {0}).status().code(), StatusCode::kInvalidArgument);
  auto ok = connector_->BeginSave("d1", 1, 4, {0}, {0});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(connector_->BeginSave("d1", 1, 4, {0}, {0}).status().code(), StatusCode::kAlreadyExists);
}

TEST_F(PrefillConnectorTest, WriteFailureSurfacesInWaitForSave) {
  ASSERT_TRUE(connector_->AcceptPeer("d1", Secret("d1"), Descriptor(), Peer(), kDecodeBlocks).ok());
  auto save = connector_->BeginSave("d1", 7, 4, {1}, {1});
  ASSERT_TRUE(save.ok());
  writer_->FailNthWrite(2, DataLoss("injected"));
  EXPECT_TRUE((*save)->SaveLayer(0).ok());
  (*save)->SaveLayer(1).IgnoreError();
  Status s = (*save)->WaitForSave(DeadlineAfterMs(5000));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  // Layer 0 landed, layer 1 did not (and was not reported).
  EXPECT_TRUE(BlockEqual(0, 1, 1));
  EXPECT_FALSE(BlockEqual(1, 1, 1));
  EXPECT_EQ((*save)->TakeCompletedLayers(), (std::vector<int>{0}));
}

TEST_F(PrefillConnectorTest, CancelStopsWritesForGood) {
  ASSERT_TRUE(connector_->AcceptPeer("d1", Secret("d1"), Descriptor(), Peer(), kDecodeBlocks).ok());
  auto save = connector_->BeginSave("d1", 9, 4, {4}, {6});
  ASSERT_TRUE(save.ok());
  writer_->SetWriteDelay(std::chrono::milliseconds(300));
  for (int l = 0; l < 3; ++l) ASSERT_TRUE((*save)->SaveLayer(l).ok());
  auto r = connector_->Cancel("d1", 9, DeadlineAfterMs(50));
  EXPECT_TRUE(r.known);
  EXPECT_TRUE(r.stopped);
  // After Cancel returned nothing more lands: snapshot, wait past the delays, compare.
  std::vector<std::byte> snap(decode_pool_->memory().size());
  std::memcpy(snap.data(), decode_pool_->base(), snap.size());
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  EXPECT_EQ(std::memcmp(snap.data(), decode_pool_->base(), snap.size()), 0);
  EXPECT_EQ((*save)->SaveLayer(0).code(), StatusCode::kCanceled);
  connector_->EndSave("d1", 9);
  // The torn-down link makes the decode handshake again.
  auto again = connector_->BeginSave("d1", 10, 4, {4}, {6});
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(PrefillConnectorTest, CancelBeforeStartRefusesTheLateRequest) {
  ASSERT_TRUE(connector_->AcceptPeer("d1", Secret("d1"), Descriptor(), Peer(), kDecodeBlocks).ok());
  auto r = connector_->Cancel("d1", 77, DeadlineAfterMs(100));
  EXPECT_FALSE(r.known);
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(connector_->BeginSave("d1", 77, 4, {0}, {0}).status().code(), StatusCode::kCanceled);
  // Another decode instance's request with the same id is unaffected.
  ASSERT_TRUE(connector_->AcceptPeer("d2", Secret("d2"), Descriptor(), Peer(), kDecodeBlocks).ok());
  EXPECT_TRUE(connector_->BeginSave("d2", 77, 4, {0}, {0}).ok());
}

TEST_F(PrefillConnectorTest, LostPeerIsRefusedUntilHandshakeAgain) {
  ASSERT_TRUE(connector_->AcceptPeer("d1", Secret("d1"), Descriptor(), Peer(), kDecodeBlocks).ok());
  reader_->Disconnect();
  auto save = connector_->BeginSave("d1", 3, 4, {0}, {0});
  EXPECT_EQ(save.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(save.status().message().find("handshake"), std::string::npos);
}

TEST_F(PrefillConnectorTest, SignalsOfFinishedRequestsAreIgnored) {
  ASSERT_TRUE(connector_->AcceptPeer("d1", Secret("d1"), Descriptor(), Peer(), kDecodeBlocks).ok());
  auto save = connector_->BeginSave("d1", 5, 4, {0}, {0});
  ASSERT_TRUE(save.ok());
  ASSERT_TRUE(tracker_.Begin(5, 3).ok());
  tracker_.Finish(5);  // the decode side gave up on request 5
  writer_->SetWriteDelay(std::chrono::milliseconds(0));
  for (int l = 0; l < 3; ++l) ASSERT_TRUE((*save)->SaveLayer(l).ok());
  ASSERT_TRUE((*save)->WaitForSave(DeadlineAfterMs(5000)).ok());
  // The three late notifications were delivered and ignored, and they did not start tracking 5.
  auto deadline = DeadlineAfterMs(2000);
  while (tracker_.ignored_signals() < 3 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(tracker_.ignored_signals(), 3u);
  EXPECT_FALSE(tracker_.IsLanded(5, 0));
  EXPECT_EQ(tracker_.active(), 0u);
}

// Sessions: the first handshake binds the id to its secret; a second one under the same id
// with another secret (another address) is refused and leaves the link alone; the real
// session still writes. Failed before sessions existed: the hijack replaced the link.
TEST_F(PrefillConnectorTest, SessionBindsTheIdToItsSecretAndRefusesAHijack) {
  EXPECT_EQ(connector_->CheckSession("d1", Secret("d1")), PrefillConnector::Session::kNone);
  EXPECT_EQ(connector_->AcceptPeer("d1", "short", Descriptor(), Peer(), kDecodeBlocks).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(connector_->AcceptPeer("d1", Secret("d1"), Descriptor(), Peer(), kDecodeBlocks).ok());
  EXPECT_EQ(connector_->CheckSession("d1", Secret("d1")), PrefillConnector::Session::kMatch);
  EXPECT_EQ(connector_->CheckSession("d1", Secret("ev")), PrefillConnector::Session::kMismatch);
  EXPECT_EQ(connector_->CheckSession("d1", ""), PrefillConnector::Session::kMismatch);

  // The hijacker's own "decode": another transport and pool.
  auto other_pool = MakePool(kDecodeBlocks);
  std::memset(other_pool->base(), 0, other_pool->memory().size());
  auto other = FakeTransport::Create();
  auto other_reg = other->Register(
      transport::MemoryRegion{other_pool->base(), other_pool->memory().size()});
  ASSERT_TRUE(other_reg.ok());
  transport::PeerDescriptor hijack;
  hijack.address = other->LocalAddress();
  hijack.regions.push_back(transport::RemoteRegion{reinterpret_cast<uint64_t>(other_pool->base()),
                                                   other_pool->memory().size(),
                                                   (*other_reg)->RemoteKey()});
  Status s = connector_->AcceptPeer("d1", Secret("ev"), Descriptor(), hijack, kDecodeBlocks);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("another session"), std::string::npos) << s.ToString();
  EXPECT_GE(connector_->stats().sessions_refused, 2u);

  // The real decode's writes still go to its own pool, none to the hijacker's.
  const std::vector<int32_t> local = {2}, remote = {7};
  auto save = connector_->BeginSave("d1", 77, 4, local, remote);
  ASSERT_TRUE(save.ok()) << save.status().ToString();
  for (int l = 0; l < 3; ++l) ASSERT_TRUE((*save)->SaveLayer(l).ok());
  ASSERT_TRUE((*save)->WaitForSave(DeadlineAfterMs(5000)).ok());
  connector_->EndSave("d1", 77);
  for (int l = 0; l < 3; ++l) EXPECT_TRUE(BlockEqual(l, 2, 7)) << l;
  std::vector<std::byte> zero(other_pool->memory().size());
  EXPECT_EQ(std::memcmp(other_pool->base(), zero.data(), zero.size()), 0);

  // The same secret may handshake again (a reconnect), and a fresh id binds its own.
  EXPECT_TRUE(connector_->AcceptPeer("d1", Secret("d1"), Descriptor(), Peer(), kDecodeBlocks).ok());
  EXPECT_TRUE(connector_->AcceptPeer("d2", Secret("d2"), Descriptor(), Peer(), kDecodeBlocks).ok());
  EXPECT_EQ(connector_->CheckSession("d2", Secret("d1")), PrefillConnector::Session::kMismatch);
}

// Sessions belong to the authenticated identity that made them (issue 15, item 2): after a
// prefill restart, another authenticated peer that claims a known decode id first makes a
// session of its own; the real decode's handshake under its own identity is still accepted,
// and neither can act in the other's session. Failed before: the real handshake was refused.
TEST_F(PrefillConnectorTest, SessionsAreBoundToTheIdentityThatMadeThem) {
  // The other peer: its own transport and pool, the real decode's id, its own secret.
  auto other_pool = MakePool(kDecodeBlocks);
  auto other = FakeTransport::Create();
  auto other_reg = other->Register(
      transport::MemoryRegion{other_pool->base(), other_pool->memory().size()});
  ASSERT_TRUE(other_reg.ok());
  transport::PeerDescriptor claim;
  claim.address = other->LocalAddress();
  claim.regions.push_back(transport::RemoteRegion{reinterpret_cast<uint64_t>(other_pool->base()),
                                                  other_pool->memory().size(),
                                                  (*other_reg)->RemoteKey()});
  ASSERT_TRUE(connector_->AcceptPeer("d1", Secret("ev"), Descriptor(), claim, kDecodeBlocks,
                                     nullptr, 1, "cert:decode-1").ok());
  ASSERT_TRUE(connector_->AcceptPeer("d1", Secret("d1"), Descriptor(), Peer(), kDecodeBlocks,
                                     nullptr, 1, "cert:decode-0").ok());
  EXPECT_EQ(connector_->CheckSession("d1", Secret("d1"), "cert:decode-0"),
            PrefillConnector::Session::kMatch);
  EXPECT_EQ(connector_->CheckSession("d1", Secret("d1"), "cert:decode-1"),
            PrefillConnector::Session::kMismatch);
  EXPECT_EQ(connector_->CheckSession("d1", Secret("ev"), "cert:decode-0"),
            PrefillConnector::Session::kMismatch);
  EXPECT_EQ(connector_->CheckSession("d1", Secret("d1"), "token"), PrefillConnector::Session::kNone);
  // The real decode's request goes through its own link, into its own pool.
  std::memset(other_pool->base(), 0, other_pool->memory().size());
  auto save = connector_->BeginSave("d1", 5, 4, {2}, {7}, "cert:decode-0");
  ASSERT_TRUE(save.ok()) << save.status().ToString();
  for (int l = 0; l < Descriptor().layout.num_layers; ++l) ASSERT_TRUE((*save)->SaveLayer(l).ok());
  ASSERT_TRUE((*save)->WaitForSave(DeadlineAfterMs(5000)).ok());
  connector_->EndSave("d1", 5, "cert:decode-0");
  const auto* o = reinterpret_cast<const uint8_t*>(other_pool->base());
  EXPECT_TRUE(std::all_of(o, o + other_pool->memory().size(), [](uint8_t b) { return b == 0; }))
      << "the real decode's KV went to the other peer's pool";
  // A cancel under the other identity touches nothing of the real session.
  auto c = connector_->Cancel("d1", 6, DeadlineAfterMs(100), "cert:decode-1");
  EXPECT_FALSE(c.known);
  EXPECT_TRUE(connector_->BeginSave("d1", 6, 4, {2}, {7}, "cert:decode-0").ok());
}

TEST(SessionSecretTest, RandomLongAndComparedWhole) {
  auto a = NewSessionSecret();
  auto b = NewSessionSecret();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), kSessionSecretBytes);
  EXPECT_NE(*a, *b);
  EXPECT_TRUE(SecretsEqual(*a, *a));
  EXPECT_FALSE(SecretsEqual(*a, *b));
  EXPECT_FALSE(SecretsEqual(*a, a->substr(0, 31)));
  EXPECT_FALSE(SecretsEqual(a->substr(0, 31), *a));
  EXPECT_FALSE(SecretsEqual("", *a));
  EXPECT_TRUE(SecretsEqual("", ""));
}

}  // namespace
}  // namespace kvstream::connector
