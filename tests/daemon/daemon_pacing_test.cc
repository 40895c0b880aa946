// The daemons' pacing keys (--pace_bytes_per_s, --pace_burst_bytes) reach the transport that
// CreateTransportFromConfig builds: its writes are paced.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "daemon/daemon_config.h"
#include "daemon/daemon_runtime.h"
#include "transport/transport.h"

namespace kvstream::daemon {
namespace {

TEST(DaemonPacing, KeysAreParsedAndRefused) {
  const char* argv[] = {"kvstream-prefill", "--pace_bytes_per_s=8388608", "--pace-burst-bytes",
                        "524288"};
  auto cfg = ParseDaemonConfig(4, const_cast<char**>(argv), "prefill");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->pace_bytes_per_s, 8388608u);
  EXPECT_EQ(cfg->pace_burst_bytes, 524288u);
  const char* bad[] = {"kvstream-prefill", "--pace_bytes_per_s=-5"};
  EXPECT_EQ(ParseDaemonConfig(2, const_cast<char**>(bad), "prefill").status().code(),
            StatusCode::kInvalidArgument);
}

// On the decode itl_target_ms is the join budget, not a rate: the decode's transport is made
// without the step cost the prefill needs, and the prefill's is refused without it.
TEST(DaemonPacing, ItlTargetPacesOnlyThePrefill) {
  DaemonConfig cfg;
  cfg.transport = "fake";
  cfg.itl_target_ms = 12;
  auto decode = CreateTransportFromConfig(cfg, "decode");
  EXPECT_TRUE(decode.ok()) << decode.status().ToString();
  auto prefill = CreateTransportFromConfig(cfg, "prefill");
  EXPECT_EQ(prefill.status().code(), StatusCode::kInvalidArgument);
}

// Transport keys without a daemon field (DaemonConfig::transport_options) reach the transport's
// options: a value the parser refuses fails CreateTransportFromConfig naming the key.
TEST(DaemonPacing, TransportKeysWithoutAFieldAreApplied) {
  DaemonConfig cfg;
  cfg.transport = "fake";
  cfg.transport_options = {{"ucx_copy_lanes", "2"}};
  EXPECT_TRUE(CreateTransportFromConfig(cfg, "prefill").ok());
  cfg.transport_options.push_back({"pace_chunk_bytes", "lots"});
  auto t = CreateTransportFromConfig(cfg, "prefill");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("pace_chunk_bytes"), std::string::npos) << t.status().ToString();
}

TEST(DaemonPacing, TransportFromConfigIsPaced) {
  DaemonConfig cfg;
  cfg.transport = "fake";
  cfg.pace_bytes_per_s = 8u << 20;   // 8 MiB/s
  cfg.pace_burst_bytes = 512u << 10;
  auto writer = CreateTransportFromConfig(cfg, "prefill");
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  cfg.pace_bytes_per_s = 0;
  auto reader = CreateTransportFromConfig(cfg, "decode");
  ASSERT_TRUE(reader.ok());
  std::vector<uint8_t> src(2u << 20, 3), dst(2u << 20, 0);
  auto local = std::move((*writer)->Register({src.data(), src.size()})).value();
  auto remote = std::move((*reader)->Register({dst.data(), dst.size()})).value();
  transport::PeerDescriptor peer{(*reader)->LocalAddress(),
                                 {{reinterpret_cast<uint64_t>(dst.data()), dst.size(),
                                   remote->RemoteKey()}},
                                 /*host=*/""};
  auto ep = std::move((*writer)->Connect(peer)).value();
  transport::WriteRequest r;
  r.local = local.get();
  r.ops = {{0, 0, src.size()}};
  const auto t0 = std::chrono::steady_clock::now();
  auto h = ep->Write(r);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE((*h)->Wait(DeadlineAfterMs(10000)).ok());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // (2 MiB - 512 KiB burst) at 8 MiB/s: >= 187 ms; unpaced this takes about a millisecond.
  EXPECT_GE(s, 0.99 * 0.1875);
  EXPECT_EQ(src, dst);
}

}  // namespace
}  // namespace kvstream::daemon
