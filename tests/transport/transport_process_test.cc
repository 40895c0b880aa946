// Two real processes over UCX on this host: the writer here, the receiver in a child.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "tests/transport/process_fixture.h"

namespace kvstream::transport {
namespace {

class TwoProcesses : public ::testing::TestWithParam<std::string> {};

TEST_P(TwoProcesses, LayersLandAndAreNotifiedInTheOtherProcess) {
  constexpr size_t kChunk = 1 << 20, kLayers = 24;
  auto peer = test::StartPeer(GetParam(), kChunk * kLayers, kChunk);
  ASSERT_NE(peer, nullptr);
  auto t = CreateTransport(test::Options("ucx", GetParam().substr(0, GetParam().find('+'))));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  std::vector<uint8_t> src(kChunk * kLayers);
  const uint64_t seed = 1000;
  for (size_t l = 0; l < kLayers; ++l) test::FillPattern(src.data() + l * kChunk, kChunk, seed + l);
  auto reg = (*t)->Register(MemoryRegion{src.data(), src.size()});
  ASSERT_TRUE(reg.ok());
  auto ep = (*t)->Connect(peer->descriptor);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();

  std::vector<std::unique_ptr<WriteHandle>> hs;
  for (size_t l = 0; l < kLayers; ++l) {
    WriteRequest r;
    r.local = reg->get();
    // Blocks of 16 KiB in reverse order: nothing coalesces, every block is its own put.
    for (size_t b = kChunk / 16384; b-- > 0;) {
      uint64_t off = l * kChunk + b * 16384;
      r.ops.push_back(CopyOp{off, off, 16384});
    }
    r.notify = true;
    r.notification = Notification{seed, static_cast<int32_t>(l), 0};
    auto h = (*ep)->Write(r);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    hs.push_back(std::move(h).value());
  }
  for (auto& h : hs) ASSERT_TRUE(h->Wait(DeadlineAfterMs(20000)).ok());
  std::vector<bool> seen(kLayers, false);
  for (size_t i = 0; i < kLayers; ++i) {
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
    ASSERT_LT(layer, static_cast<int>(kLayers));
    EXPECT_EQ(verdict, "OK") << "layer " << layer << " was notified before its data was complete";
    seen[layer] = true;
  }
  for (size_t l = 0; l < kLayers; ++l) EXPECT_TRUE(seen[l]) << l;
}

// Same-host writes of many MiB are copied by several threads (KVSTREAM_UCX_COPY_LANES forces
// 4 here, whatever this machine's core count): 64 KiB blocks in reverse order, each layer cut
// into lanes mid-run, must still land byte-exact before their notification.
TEST_P(TwoProcesses, LargeLayersLandThroughSeveralCopyLanes) {
  constexpr size_t kChunk = 12 << 20, kLayers = 3, kBlock = 64 << 10;
  ASSERT_EQ(setenv("KVSTREAM_UCX_COPY_LANES", "4", 1), 0);
  auto peer = test::StartPeer(GetParam(), kChunk * kLayers, kChunk);
  ASSERT_NE(peer, nullptr);
  auto t = CreateTransport(test::Options("ucx", GetParam().substr(0, GetParam().find('+'))));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  std::vector<uint8_t> src(kChunk * kLayers);
  const uint64_t seed = 2000;
  for (size_t l = 0; l < kLayers; ++l) test::FillPattern(src.data() + l * kChunk, kChunk, seed + l);
  auto reg = (*t)->Register(MemoryRegion{src.data(), src.size()});
  ASSERT_TRUE(reg.ok());
  auto ep = (*t)->Connect(peer->descriptor);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  std::vector<std::unique_ptr<WriteHandle>> hs;
  for (size_t l = 0; l < kLayers; ++l) {
    WriteRequest r;
    r.local = reg->get();
    for (size_t b = kChunk / kBlock; b-- > 0;) {
      const uint64_t off = l * kChunk + b * kBlock;
      r.ops.push_back(CopyOp{off, off, kBlock});
    }
    r.notify = true;
    r.notification = Notification{seed, static_cast<int32_t>(l), 0};
    auto h = (*ep)->Write(r);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    hs.push_back(std::move(h).value());
  }
  for (auto& h : hs) EXPECT_TRUE(h->Wait(DeadlineAfterMs(20000)).ok());
  unsetenv("KVSTREAM_UCX_COPY_LANES");
  for (size_t i = 0; i < kLayers; ++i) {
    std::string line;
    ASSERT_TRUE(peer->process.ReadLine(&line, DeadlineAfterMs(10000))) << "note " << i;
    std::istringstream in(line);
    std::string tag, verdict;
    uint64_t rid;
    int layer;
    in >> tag >> rid >> layer >> verdict;
    ASSERT_EQ(tag, "NOTE");
    EXPECT_EQ(rid, seed);
    EXPECT_EQ(verdict, "OK") << "layer " << layer << " was notified before its data was complete";
  }
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
