// ResolveBackend for CUDA memory (no GPU needed): it must name a backend that the registry
// builds, and pick UCX directly exactly when the UCX backend reports CUDA memory support.
#include <gtest/gtest.h>

#include <algorithm>

#include "transport/transport.h"

namespace kvstream::transport {
namespace {

TEST(SelectGpuBackend, NamesARegisteredBackendMatchingUcxCapabilities) {
  TransportOptions o;
  o.backend = "ucx";
  o.ucx.tls = "tcp";
  auto chosen = ResolveBackend(o, MemoryKind::kCuda);
  ASSERT_TRUE(chosen.ok()) << chosen.status().ToString();
  auto ucx = CreateTransport(o);
  ASSERT_TRUE(ucx.ok()) << ucx.status().ToString();
  EXPECT_EQ(chosen.value(), ucx.value()->capabilities().cuda_memory ? "ucx" : "ucx_staged");
  auto built = AvailableBackends();
  EXPECT_NE(std::find(built.begin(), built.end(), chosen.value()), built.end())
      << chosen.value() << " is not in the transport registry";
  EXPECT_NE(std::find(built.begin(), built.end(), "cuda_ipc"), built.end());
  // Host memory, or another backend asked for by name: returned as asked.
  EXPECT_EQ(ResolveBackend(o, MemoryKind::kHost).value(), "ucx");
  o.backend = "cuda_ipc";
  EXPECT_EQ(ResolveBackend(o, MemoryKind::kCuda).value(), "cuda_ipc");
}

TEST(SelectGpuBackend, GpuBackendsReportTheirCapabilitiesOrWhyNot) {
  // Without a GPU, creating them fails with a reason instead of crashing; with one, they
  // move CUDA memory only.
  for (const char* name : {"cuda_ipc", "ucx_staged"}) {
    TransportOptions o;
    o.backend = name;
    o.ucx.tls = "tcp";
    auto t = CreateTransport(o);
    if (!t.ok()) {
      EXPECT_EQ(t.status().code(), StatusCode::kUnavailable) << t.status().ToString();
      continue;
    }
    EXPECT_TRUE(t.value()->capabilities().cuda_memory);
    EXPECT_FALSE(t.value()->capabilities().host_memory);
    EXPECT_TRUE(t.value()->capabilities().notifications);
  }
}

}  // namespace
}  // namespace kvstream::transport
