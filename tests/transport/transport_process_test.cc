// Two real processes over UCX on this host: the writer here, the receiver in a child.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "tests/transport/process_fixture.h"

namespace kvstream::transport {
namespace {

class TwoProcesses : public ::testing::TestWithParam<std::string> {
 protected:
  // Writes `layers` layers of `chunk` bytes into a receiver process, each layer's blocks of
  // `block` bytes in reverse order (so nothing coalesces) with a notification per layer, and
  // checks every layer was notified once, by the receiver, only after its data was complete.
  void WriteLayersInReverseBlocks(size_t chunk, size_t layers, size_t block, uint64_t seed,
                                  int copy_lanes = 0) {
    auto peer = test::StartPeer(GetParam(), chunk * layers, chunk);
    ASSERT_NE(peer, nullptr);
    TransportOptions options = test::Options("ucx", GetParam().substr(0, GetParam().find('+')));
    options.ucx.copy_lanes = copy_lanes;
    auto t = CreateTransport(options);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    std::vector<uint8_t> src(chunk * layers);
    for (size_t l = 0; l < layers; ++l) test::FillPattern(src.data() + l * chunk, chunk, seed + l);
    auto reg = (*t)->Register(MemoryRegion{src.data(), src.size()});
    ASSERT_TRUE(reg.ok());
    auto ep = test::ConnectAdmitted(**t, *peer, peer->descriptor);
    ASSERT_TRUE(ep.ok()) << ep.status().ToString();

    std::vector<std::unique_ptr<WriteHandle>> hs;
    for (size_t l = 0; l < layers; ++l) {
      WriteRequest r;
      r.local = reg->get();
      for (size_t b = chunk / block; b-- > 0;) {
        const uint64_t off = l * chunk + b * block;
        r.ops.push_back(CopyOp{off, off, block});
      }
      r.notify = true;
      r.notification = Notification{seed, static_cast<int32_t>(l), 0};
      auto h = (*ep)->Write(r);
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      hs.push_back(std::move(h).value());
    }
    for (auto& h : hs) ASSERT_TRUE(h->Wait(DeadlineAfterMs(20000)).ok());
    std::vector<bool> seen(layers, false);
    for (size_t i = 0; i < layers; ++i) {
      std::string line;
      ASSERT_TRUE(peer->process.ReadLine(&line, DeadlineAfterMs(10000))) << "note " << i;
      std::istringstream in(line);
      std::string tag, verdict;
      uint64_t rid;
      int layer;
      in >> tag >> rid >> layer >> verdict;
      ASSERT_EQ(tag, "NOTE");
      EXPECT_EQ(rid, seed);
      ASSERT_GE(layer, 0);
      ASSERT_LT(layer, static_cast<int>(layers));
      EXPECT_EQ(verdict, "OK") << "layer " << layer << " was notified before its data was complete";
      seen[layer] = true;
    }
    for (size_t l = 0; l < layers; ++l) EXPECT_TRUE(seen[l]) << l;
  }
};

TEST_P(TwoProcesses, LayersLandAndAreNotifiedInTheOtherProcess) {
  // Blocks of 16 KiB: every block is its own put.
  WriteLayersInReverseBlocks(1 << 20, 24, 16384, 1000);
}

// Same-host writes of many MiB are copied by several threads (UcxOptions::copy_lanes forces
// 4 here, whatever this machine's core count): 64 KiB blocks in reverse order, each layer cut
// into lanes mid-run, must still land byte-exact before their notification.
TEST_P(TwoProcesses, LargeLayersLandThroughSeveralCopyLanes) {
  WriteLayersInReverseBlocks(12 << 20, 3, 64 << 10, 2000, /*copy_lanes=*/4);
}

std::string TlsName(const ::testing::TestParamInfo<std::string>& info) {
  if (info.param.empty()) return "default";
  std::string n = info.param;
  std::replace(n.begin(), n.end(), ',', '_');
  std::replace(n.begin(), n.end(), '+', '_');
  return n;
}

INSTANTIATE_TEST_SUITE_P(Ucx, TwoProcesses, ::testing::Values("tcp", "sm,tcp", "sm,tcp+alloc", ""), TlsName);

}  // namespace
}  // namespace kvstream::transport
