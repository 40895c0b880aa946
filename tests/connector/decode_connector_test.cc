// DecodeConnector end to end in one process: a real PrefillServer (tiny CPU model) over
// in-process gRPC, the fake transport between the pools. Lifecycle: blocks (the keepalive) are
// released only once no write can land, however the load ends.
#include "connector/decode_connector.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "daemon/daemon_runtime.h"
#include "model/generate.h"
#include "prefill/prefill_server.h"
#include "transport/testing/fake_transport.h"

namespace kvstream::connector {
namespace {

using transport::testing::FakeTransport;

constexpr int kBlocks = 64;

class DecodeConnectorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon::DaemonConfig cfg;
    cfg.model = "tiny";
    cfg.threads = 1;
    cfg.pool_blocks = kBlocks;
    cfg.cancel_timeout_ms = 2000;
    cfg.fault_layer_delay_ms = fault_layer_delay_ms_;
    auto pm = daemon::LoadServingModel(cfg);
    ASSERT_TRUE(pm.ok()) << pm.status().ToString();
    prefill_model_ = std::move(pm).value();
    auto dm = daemon::LoadServingModel(cfg);
    ASSERT_TRUE(dm.ok());
    decode_model_ = std::move(dm).value();

    auto pt = FakeTransport::Create();
    prefill_transport_ = pt.get();
    auto pc = PrefillConnector::Create(std::move(pt), prefill_model_.pool.get(),
                                       MakeLayoutDescriptor(prefill_model_.backend->config(), 16));
    ASSERT_TRUE(pc.ok()) << pc.status().ToString();
    prefill_connector_ = std::move(pc).value();
    server_impl_ = std::make_unique<prefill::PrefillServer>(
        cfg, prefill_model_.backend.get(), prefill_model_.pool.get(), prefill_connector_.get());
    auto server = daemon::StartGrpcServer("127.0.0.1:0", {server_impl_.get()}, &port_);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();

    DecodeConnectorOptions opt;
    opt.prefill_address = "127.0.0.1:" + std::to_string(port_);
    opt.cancel_timeout_ms = 2000;
    opt.quarantine_ms = 200;
    auto dt = FakeTransport::Create();
    decode_transport_ = dt.get();
    auto dc = DecodeConnector::Create(opt, std::move(dt), decode_model_.pool.get(),
                                      MakeLayoutDescriptor(decode_model_.backend->config(), 16));
    ASSERT_TRUE(dc.ok()) << dc.status().ToString();
    decode_ = std::move(dc).value();
  }
  void TearDown() override {
    decode_.reset();
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
    server_.reset();
    server_impl_.reset();
    prefill_connector_.reset();
  }

  // Blocks for n tokens from the decode pool, owned by a shared lease (the keepalive).
  std::shared_ptr<model::BlockLease> Lease(int n) {
    auto ids = decode_model_.pool->allocator().Allocate(model::BlocksForTokens(n, 16));
    EXPECT_TRUE(ids.ok());
    return std::make_shared<model::BlockLease>(&decode_model_.pool->allocator(), *ids);
  }
  static bool Released(const std::weak_ptr<model::BlockLease>& w, int timeout_ms) {
    auto deadline = DeadlineAfterMs(timeout_ms);
    while (!w.expired() && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return w.expired();
  }
  std::vector<int32_t> Prompt(int n) {
    std::vector<int32_t> p(n);
    for (int i = 0; i < n; ++i) p[i] = (i * 37 + 11) % 512;
    return p;
  }

  int64_t fault_layer_delay_ms_ = 0;  // the prefill's forward sleeps this long per layer
  daemon::ServingModel prefill_model_, decode_model_;
  FakeTransport* prefill_transport_ = nullptr;
  FakeTransport* decode_transport_ = nullptr;
  std::unique_ptr<PrefillConnector> prefill_connector_;
  std::unique_ptr<prefill::PrefillServer> server_impl_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<DecodeConnector> decode_;
};

TEST_F(DecodeConnectorTest, LoadedKvMatchesLocalPrefillByteForByte) {
  auto tokens = Prompt(40);
  auto lease = Lease(40);
  std::weak_ptr<model::BlockLease> weak = lease;
  ASSERT_TRUE(decode_->StartLoad(1, tokens, lease->ids(), true, DeadlineAfterMs(10000), lease).ok());
  for (int l = 0; l < 2; ++l) ASSERT_TRUE(decode_->WaitForLayer(1, l, DeadlineAfterMs(10000)).ok());
  auto info = decode_->WaitForLoad(1, DeadlineAfterMs(10000));
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_GT(info->kv_bytes, 0u);
  // The same prefix computed locally into other blocks gives the same bytes.
  auto local = Lease(40);
  model::SeqInput seq{tokens, 0, local->ids()};
  model::ForwardOutput out;
  ASSERT_TRUE(decode_model_.backend->Forward(*decode_model_.pool, std::span(&seq, 1), nullptr, {}, &out).ok());
  const auto& lay = decode_model_.pool->layout();
  const size_t tok_bytes = lay.head_dim * lay.elem_bytes();
  for (int l = 0; l < lay.num_layers; ++l)
    for (int t = 0; t < 40; ++t)
      for (int kv = 0; kv < 2; ++kv)
        for (int h = 0; h < lay.num_kv_heads; ++h) {
          auto at = [&](const model::BlockLease& b) {
            return decode_model_.pool->block_ptr(l, b.ids()[t / 16]) +
                   ((kv * lay.num_kv_heads + h) * lay.block_size + t % 16) * tok_bytes;
          };
          ASSERT_EQ(std::memcmp(at(*lease), at(*local), tok_bytes), 0) << l << " " << t;
        }
  decode_->Finished(1);
  lease.reset();
  EXPECT_TRUE(Released(weak, 2000));
  EXPECT_EQ(decode_->stats().loads_ok, 1u);
}

// A prefill that restarts on the same address: a load sent while the decode's channel is still
// in gRPC's reconnect backoff (the old connection refused, the new prefill already listening)
// reconnects and handshakes at once and lands. Before, its Prefill call failed at once with
// "failed to connect to all addresses" (seen in daemons_auth_test under CI).
TEST_F(DecodeConnectorTest, LoadRightAfterAPrefillRestartReconnectsAndLands) {
  auto first = Lease(20);
  ASSERT_TRUE(decode_->StartLoad(10, Prompt(20), first->ids(), true, DeadlineAfterMs(10000), first).ok());
  ASSERT_TRUE(decode_->WaitForLoad(10, DeadlineAfterMs(10000)).ok());
  decode_->Finished(10);
  // The prefill goes away; the channel's reconnects are refused (backoff ~100 ms, then ~160 ms).
  server_->Shutdown(std::chrono::system_clock::now());
  server_.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  daemon::DaemonConfig cfg;
  cfg.model = "tiny";
  cfg.threads = 1;
  cfg.pool_blocks = kBlocks;
  cfg.cancel_timeout_ms = 2000;
  server_impl_ = std::make_unique<prefill::PrefillServer>(
      cfg, prefill_model_.backend.get(), prefill_model_.pool.get(), prefill_connector_.get());
  int port = 0;
  auto server = daemon::StartGrpcServer("127.0.0.1:" + std::to_string(port_), {server_impl_.get()}, &port);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  server_ = std::move(server).value();
  ASSERT_EQ(port, port_);
  // Inside the channel's backoff: its next attempt is not due yet.
  auto lease = Lease(20);
  ASSERT_TRUE(decode_->StartLoad(11, Prompt(20), lease->ids(), true, DeadlineAfterMs(10000), lease).ok());
  auto info = decode_->WaitForLoad(11, DeadlineAfterMs(10000));
  EXPECT_TRUE(info.ok()) << info.status().ToString();
  decode_->Finished(11);
}

TEST_F(DecodeConnectorTest, FailedWriteFailsTheWaitAndReleasesBlocks) {
  prefill_transport_->FailNthWrite(1, DataLoss("injected write failure"));
  auto lease = Lease(20);
  std::weak_ptr<model::BlockLease> weak = lease;
  ASSERT_TRUE(decode_->StartLoad(2, Prompt(20), lease->ids(), true, DeadlineAfterMs(10000), lease).ok());
  lease.reset();
  Status s = decode_->WaitForLayer(2, 0, DeadlineAfterMs(10000));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("injected write failure"), std::string::npos) << s.ToString();
  decode_->Finished(2);
  EXPECT_TRUE(Released(weak, 5000));
  // Both pools whole again: the prefill freed its blocks too.
  auto deadline = DeadlineAfterMs(5000);
  while (prefill_model_.pool->allocator().free_count() != kBlocks && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(prefill_model_.pool->allocator().free_count(), kBlocks);
}

// The Prefill call returns OK but layer 1's notification never reaches the decode: the load
// fails (kDataLoss naming the layer) after a grace of cancel_timeout_ms, its blocks come back.
// Failed before: the call's OK marked every layer landed and the load succeeded.
TEST_F(DecodeConnectorTest, OkCallWithoutEveryLayersOwnNotificationFailsTheLoad) {
  prefill_transport_->DropNotifications(1);
  auto lease = Lease(20);
  std::weak_ptr<model::BlockLease> weak = lease;
  const auto start = Clock::now();
  ASSERT_TRUE(decode_->StartLoad(11, Prompt(20), lease->ids(), true, DeadlineAfterMs(10000), lease).ok());
  lease.reset();
  EXPECT_TRUE(decode_->WaitForLayer(11, 0, DeadlineAfterMs(10000)).ok());
  Status s = decode_->WaitForLayer(11, 1, DeadlineAfterMs(10000));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find("no notification of layers 1 reached this decode"), std::string::npos)
      << s.ToString();
  auto info = decode_->WaitForLoad(11, DeadlineAfterMs(10000));
  EXPECT_EQ(info.status().code(), StatusCode::kDataLoss) << info.status().ToString();
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(6000));  // the grace is 2 s
  decode_->Finished(11);
  EXPECT_TRUE(Released(weak, 5000));
  EXPECT_EQ(decode_->stats().loads_failed, 1u);
  EXPECT_EQ(decode_->stats().loads_ok, 0u);

  // With every notification delivered again, the next load lands.
  prefill_transport_->DropNotifications(FakeTransport::kNoLayer);
  auto lease2 = Lease(20);
  ASSERT_TRUE(decode_->StartLoad(12, Prompt(21), lease2->ids(), true, DeadlineAfterMs(10000), lease2).ok());
  auto ok = decode_->WaitForLoad(12, DeadlineAfterMs(10000));
  EXPECT_TRUE(ok.ok()) << ok.status().ToString();
  decode_->Finished(12);
}

TEST_F(DecodeConnectorTest, FinishedMidLoadHoldsBlocksUntilTheWriterStopped) {
  prefill_transport_->SetWriteDelay(std::chrono::milliseconds(300));
  auto lease = Lease(30);
  std::weak_ptr<model::BlockLease> weak = lease;
  ASSERT_TRUE(decode_->StartLoad(3, Prompt(30), lease->ids(), true, DeadlineAfterMs(10000), lease).ok());
  lease.reset();
  // Let the prefill post its first (delayed) write.
  auto deadline = DeadlineAfterMs(5000);
  while (prefill_transport_->writes_started() == 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_GT(prefill_transport_->writes_started(), 0u);
  decode_->Finished(3);
  ASSERT_TRUE(Released(weak, 8000));
  // Released means stopped: nothing lands afterwards.
  std::vector<std::byte> snap(decode_model_.pool->memory().size());
  std::memcpy(snap.data(), decode_model_.pool->base(), snap.size());
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  EXPECT_EQ(std::memcmp(snap.data(), decode_model_.pool->base(), snap.size()), 0);
  // Late notifications of request 3, if any, were ignored, never applied.
  EXPECT_FALSE(decode_->tracker().IsLanded(3, 0));
}

TEST_F(DecodeConnectorTest, UnreachablePrefillFailsWithinTheDeadline) {
  server_->Shutdown(std::chrono::system_clock::now());
  server_.reset();
  auto lease = Lease(20);
  std::weak_ptr<model::BlockLease> weak = lease;
  auto start = Clock::now();
  ASSERT_TRUE(decode_->StartLoad(4, Prompt(20), lease->ids(), true, DeadlineAfterMs(1500), lease).ok());
  lease.reset();
  Status s = decode_->WaitForLayer(4, 0, DeadlineAfterMs(10000));
  EXPECT_FALSE(s.ok());
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(5000));
  decode_->Finished(4);
  EXPECT_TRUE(Released(weak, 5000));
}

TEST_F(DecodeConnectorTest, TimeoutBeforeAnyCallSaysTheHandshakeIsPendingAndWhy) {
  server_->Shutdown(std::chrono::system_clock::now());
  server_.reset();
  DecodeConnectorOptions opt;
  opt.prefill_address = "127.0.0.1:" + std::to_string(port_);
  opt.handshake_timeout_ms = 200;  // each attempt gives up fast, so one has failed by the wait
  auto c = DecodeConnector::Create(opt, FakeTransport::Create(), decode_model_.pool.get(),
                                   MakeLayoutDescriptor(decode_model_.backend->config(), 16));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto lease = Lease(20);
  ASSERT_TRUE((*c)->StartLoad(7, Prompt(20), lease->ids(), true, DeadlineAfterMs(3000), lease).ok());
  Status s = (*c)->WaitForLayer(7, 0, DeadlineAfterMs(1200));
  ASSERT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
  EXPECT_NE(s.message().find("no Prefill call made yet (handshake pending"), std::string::npos)
      << s.ToString();
  EXPECT_NE(s.message().find("last attempt: TIMEOUT: handshake with prefill"), std::string::npos)
      << s.ToString();
  (*c)->Finished(7);
}

TEST_F(DecodeConnectorTest, LayoutMismatchIsRefusedAtHandshakeNamingTheField) {
  DecodeConnectorOptions opt;
  opt.prefill_address = "127.0.0.1:" + std::to_string(port_);
  LayoutDescriptor wrong = MakeLayoutDescriptor(decode_model_.backend->config(), 16);
  wrong.layout.block_size = 32;
  auto mem = model::AllocateHostPoolMemory(wrong.layout.pool_bytes(8));
  ASSERT_TRUE(mem.ok());
  model::KvPool pool(wrong.layout, 8, std::move(mem).value());
  auto c = DecodeConnector::Create(opt, FakeTransport::Create(), &pool, wrong);
  ASSERT_TRUE(c.ok());
  Status s = (*c)->Handshake(DeadlineAfterMs(5000));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("block_size differs"), std::string::npos) << s.ToString();
  // A load through it fails with the same message, and its blocks come back.
  auto ids = pool.allocator().Allocate(1);
  ASSERT_TRUE(ids.ok());
  auto lease = std::make_shared<model::BlockLease>(&pool.allocator(), *ids);
  std::weak_ptr<model::BlockLease> weak = lease;
  ASSERT_TRUE((*c)->StartLoad(9, Prompt(8), lease->ids(), true, DeadlineAfterMs(5000), lease).ok());
  lease.reset();
  Status w = (*c)->WaitForLayer(9, 0, DeadlineAfterMs(5000));
  EXPECT_NE(w.message().find("block_size"), std::string::npos) << w.ToString();
  (*c)->Finished(9);
  EXPECT_TRUE(Released(weak, 5000));
}

// A load that does not land within the wait ends with a status that says what was missing:
// which layers landed, whether the prefill ever acknowledged the request, where its call is.
class SlowPrefillTest : public DecodeConnectorTest {
 protected:
  void SetUp() override {
    fault_layer_delay_ms_ = 1000;
    DecodeConnectorTest::SetUp();
  }
};

TEST_F(SlowPrefillTest, TimeoutSaysWhichLayerAndWhetherThePrefillHadTheRequest) {
  ASSERT_TRUE(decode_->Handshake(DeadlineAfterMs(5000)).ok());
  // Request 5 holds the prefill's forward (1 s before each layer); request 6 queues behind it.
  auto lease5 = Lease(20), lease6 = Lease(20);
  ASSERT_TRUE(decode_->StartLoad(5, Prompt(20), lease5->ids(), true, DeadlineAfterMs(20000), lease5).ok());
  Status s5;
  for (auto until = DeadlineAfterMs(5000); Clock::now() < until;) {
    s5 = decode_->WaitForLayer(5, 0, DeadlineAfterMs(50));
    if (s5.code() != StatusCode::kTimeout || s5.message().find("never acknowledged") == std::string::npos) break;
  }
  ASSERT_TRUE(decode_->StartLoad(6, Prompt(21), lease6->ids(), true, DeadlineAfterMs(20000), lease6).ok());
  Status s6 = decode_->WaitForLayer(6, 0, DeadlineAfterMs(400));
  ASSERT_EQ(s5.code(), StatusCode::kTimeout) << s5.ToString();
  EXPECT_NE(s5.message().find("waiting for layer 0 of request 5"), std::string::npos) << s5.ToString();
  EXPECT_NE(s5.message().find("layers landed 0 of 2"), std::string::npos) << s5.ToString();
  EXPECT_NE(s5.message().find(" acknowledged the request"), std::string::npos) << s5.ToString();
  EXPECT_EQ(s5.message().find("never acknowledged"), std::string::npos) << s5.ToString();
  EXPECT_NE(s5.message().find("Prefill call still open"), std::string::npos) << s5.ToString();
  ASSERT_EQ(s6.code(), StatusCode::kTimeout) << s6.ToString();
  EXPECT_NE(s6.message().find("never acknowledged the request"), std::string::npos) << s6.ToString();
  // Layer 0 of request 5 lands after its delay; the next timeout names layer 1 and the landed 0.
  ASSERT_TRUE(decode_->WaitForLayer(5, 0, DeadlineAfterMs(10000)).ok());
  Status s5b = decode_->WaitForLayer(5, 1, DeadlineAfterMs(100));
  if (!s5b.ok()) {  // layer 1 may have landed already on a slow machine
    EXPECT_NE(s5b.message().find("waiting for layer 1 of request 5"), std::string::npos) << s5b.ToString();
    EXPECT_NE(s5b.message().find("layers landed 1 of 2 (0)"), std::string::npos) << s5b.ToString();
  }
  // Both loads then complete normally.
  for (uint64_t id : {5u, 6u}) {
    auto info = decode_->WaitForLoad(id, DeadlineAfterMs(15000));
    EXPECT_TRUE(info.ok()) << id << ": " << info.status().ToString();
    decode_->Finished(id);
  }
}

// Notifications whose MAC does not verify are dropped and counted (issue 15, item 2): a
// forger that reaches the decode's transport (here a third fake writer) sends every layer of a
// running request with a forged tag; none counts as landed, the genuine ones still do.
TEST_F(SlowPrefillTest, ForgedNotificationsAreDroppedAndCounted) {
  ASSERT_TRUE(decode_->Handshake(DeadlineAfterMs(5000)).ok());
  auto forger = FakeTransport::Create();
  std::vector<uint8_t> nothing(16, 0);
  auto reg = forger->Register(transport::MemoryRegion{nothing.data(), nothing.size()});
  ASSERT_TRUE(reg.ok());
  transport::PeerDescriptor d;
  d.address = decode_transport_->LocalAddress();
  const uint64_t base = reinterpret_cast<uint64_t>(decode_model_.pool->base());
  std::unique_ptr<transport::Endpoint> ep;
  for (int id = 0; id < 8 && !ep; ++id) {  // the fake's key format is public: guess the id
    d.regions = {{base, decode_model_.pool->memory().size(), d.address + ":" + std::to_string(id)}};
    auto e = forger->Connect(d);
    if (e.ok()) ep = std::move(e).value();
  }
  ASSERT_NE(ep, nullptr);
  auto lease = Lease(20);
  ASSERT_TRUE(decode_->StartLoad(41, Prompt(20), lease->ids(), true, DeadlineAfterMs(20000), lease).ok());
  const int layers = decode_model_.pool->layout().num_layers;
  for (int l = 0; l < layers; ++l) {
    transport::WriteRequest w;
    w.local = reg->get();
    w.notify = true;
    w.notification.request_id = 41;
    w.notification.layer = l;
    w.notification.mac.fill(0x5a);  // no secret: any tag is a guess
    auto h = ep->Write(w);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    ASSERT_TRUE((*h)->Wait(DeadlineAfterMs(5000)).ok());
  }
  EXPECT_EQ(decode_->stats().notifications_dropped, uint64_t(layers));
  // The prefill sleeps 1 s before each layer: nothing of request 41 has landed yet.
  EXPECT_EQ(decode_->WaitForLayer(41, 0, DeadlineAfterMs(50)).code(), StatusCode::kTimeout);
  auto info = decode_->WaitForLoad(41, DeadlineAfterMs(20000));
  EXPECT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(decode_->stats().notifications_dropped, uint64_t(layers));
  decode_->Finished(41);
}

}  // namespace
}  // namespace kvstream::connector
