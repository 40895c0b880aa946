// A real prefill daemon given a Handshake whose transport blobs are malformed inside a valid
// envelope (a bogus UCX listener address or memory key, truncated, garbage, oversized) answers
// INVALID_ARGUMENT naming the field and keeps serving (issue 15, item 5). Before the blobs were
// checked, the first of these aborted the prefill (UCX assertion in ucp_address_unpack).
#include <random>

#include "connector/handshake.h"
#include "daemon/daemon_runtime.h"
#include "tests/daemons/disagg_fixture.h"
#include "tests/transport/ucx_blob_util.h"
#include "tests/fault_record.h"
#include "transport/transport.h"

namespace kvstream::testing {
namespace {

namespace v1 = kvstream::v1;

using transport::test::WithPayload;
using transport::test::WithUcxPart;

TEST_F(DisaggTest, BogusTransportBlobsInAHandshakeAreRefusedAndThePrefillKeepsServing) {
  DaemonPair pair;
  pair.common = {"--model=tiny"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));

  // A handshake the prefill would accept: the tiny layout, a UCX transport of our own and a
  // registered pool of the right size.
  daemon::DaemonConfig cfg;
  cfg.model = "tiny";
  cfg.threads = 1;
  auto model = daemon::LoadServingModel(cfg);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const connector::LayoutDescriptor layout =
      connector::MakeLayoutDescriptor(model->backend->config(), cfg.block_size);
  const int blocks = 8;
  std::vector<uint8_t> pool(layout.layout.pool_bytes(blocks));
  transport::TransportOptions to;
  to.backend = "ucx";
  to.ucx.tls = "tcp";
  to.ucx.net_devices = "lo";
  auto t = transport::CreateTransport(to);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto reg = (*t)->Register(transport::MemoryRegion{pool.data(), pool.size()});
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  v1::HandshakeRequest good;
  good.set_decode_instance_id("attacker");
  good.set_transport_address((*t)->LocalAddress());
  auto* region = good.add_regions();
  region->set_addr(reinterpret_cast<uint64_t>(pool.data()));
  region->set_length(pool.size());
  region->set_key((*reg)->RemoteKey());
  good.set_pool_blocks(blocks);
  connector::ToProto(layout, good.mutable_layout());
  good.set_transport_backend("ucx");
  good.set_session_secret(std::string(32, 's'));

  std::mt19937_64 rng(15);
  auto garbage = [&](size_t n) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    return s;
  };
  struct Case {
    std::string what, field;
    v1::HandshakeRequest req;
  };
  std::vector<Case> cases;
  for (auto [what, ucx] : std::vector<std::pair<std::string, std::string>>{
           {"bogus address payload", std::string(1, '\x0f') + garbage(63)},
           {"garbage address", garbage(200)},
           {"one-byte address", "x"},
           {"oversized address", std::string(1 << 20, '\x41')}}) {
    Case c{what, "address", good};
    c.req.set_transport_address(WithPayload(good.transport_address(), ucx));
    cases.push_back(c);
  }
  for (auto [what, ucx] : std::vector<std::pair<std::string, std::string>>{
           {"garbage key", garbage(40)}, {"every md bit set", std::string(64, '\xff')}}) {
    Case c{what, "memory key", good};
    c.req.mutable_regions(0)->set_key(WithUcxPart(good.regions(0).key(), ucx));
    cases.push_back(c);
  }
  auto stub = PrefillStub(prefill_address());
  for (const Case& c : cases) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::HandshakeResponse resp;
    grpc::Status s = stub->Handshake(&ctx, c.req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.what << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(c.field), std::string::npos) << c.what << ": " << s.error_message();
    ASSERT_TRUE(prefill_->Running()) << "the prefill died on: " << c.what;
  }
  // Still serving: a request through the decode gets its tokens.
  auto r = CallGenerate(*stub_, MakePrompt(40, 256, 1), 4, v1::LOAD_MODE_PIPELINED, 30000);
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens.size(), 4u);
  FaultOutcome o;
  o.tries = static_cast<int>(cases.size());
  o.requests = 1;
  o.lost = r.status.ok() ? 0 : 1;
  o.aborts = prefill_->Running() ? 0 : 1;
  o.outcome = "INVALID_ARGUMENT naming the field each time; the prefill kept serving";
  RecordFault("data.bogus_ucx_blobs_in_handshake",
              "handshakes whose UCX address or memory key has a valid envelope and a bogus, "
              "truncated, oversized or garbage payload", o);
}

}  // namespace
}  // namespace kvstream::testing
