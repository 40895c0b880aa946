// The transport conformance suite (tests/transport/conformance/) over host memory and every
// CPU backend built in: fake, and ucx over TCP, with shared memory (same-host copies) and with
// UCX's own pick. The GPU kinds: transport_conformance_gpu_test (label gpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "tests/transport/conformance/in_process_cases.h"
#include "tests/transport/conformance/peer_process_cases.h"
#include "tests/transport/test_util.h"
#include "transport/transport.h"

namespace kvstream::transport::conformance {

// This binary has host memory only.
Result<std::unique_ptr<Transport>> MakeTransport(const Config& c, int) {
  return CreateTransport(c.options);
}
void* AllocateMemory(Memory m, int, size_t bytes) {
  return m == Memory::kHost ? std::calloc(1, bytes) : nullptr;
}
void FreeMemory(Memory, void* p) { std::free(p); }
void CopyMemory(void* dst, const void* src, size_t n) { std::memcpy(dst, src, n); }
int VisibleGpus() { return 0; }

namespace {

std::vector<Config> HostConfigs() {
  std::vector<Config> out;
  for (const test::BackendConfig& b : test::AllConfigs()) {
    out.push_back(Config{b.label, b.options.backend, Memory::kHost, -1, -1, b.options});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Backends, TransportConformance, ::testing::ValuesIn(HostConfigs()),
                         ConfigName);

TEST(TransportRegistry, KnowsItsBackends) {
  auto built = AvailableBackends();
  EXPECT_NE(std::find(built.begin(), built.end(), "fake"), built.end());
  auto t = CreateTransport(test::Options("no-such-backend"));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotSupported);
}

}  // namespace
}  // namespace kvstream::transport::conformance
