// ucx::MapPeerRegion (what the host-staged GPU path's zero-copy leg stands on): a same-host
// peer's Allocate()d region mapped into the writer, stores through it visible in the peer's
// memory, the mapping outliving the endpoint; refused with kNotSupported where the endpoint has
// no same-host mapping (registered memory, shared memory off, another backend).
// Two UCX transports in this one process: the same-host checks (boot id, pid namespace, pidfd,
// a one-byte process_vm_readv) hold for a process and itself.
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tests/transport/test_util.h"
#include "transport/ucx/ucx_transport.h"

namespace kvstream::transport {
namespace {

constexpr size_t kBytes = 1 << 20;

// Whether this kernel (or sandbox) offers what the same-host path needs: a boot id to tell
// hosts apart, pidfds, process_vm_readv.
bool SameHostCopiesPossible() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!std::getline(boot, id) || id.empty()) return false;
  int fd = static_cast<int>(syscall(SYS_pidfd_open, getpid(), 0));
  if (fd < 0) return false;
  close(fd);
  uint8_t a = 7, b = 0;
  iovec l{&b, 1}, r{&a, 1};
  return process_vm_readv(getpid(), &l, 1, &r, 1, 0) == 1 && b == 7;
}

struct Pair {
  std::unique_ptr<Transport> rx, tx;
  std::unique_ptr<Registration> allocated, registered;
  std::vector<uint8_t> host = std::vector<uint8_t>(kBytes, 0);
  std::unique_ptr<Endpoint> ep;
};

void MakePair(const std::string& tls, Pair* p) {
  auto rx = ucx::CreateUcxTransport(test::Options("ucx", tls));
  ASSERT_TRUE(rx.ok()) << rx.status().ToString();
  auto tx = ucx::CreateUcxTransport(test::Options("ucx", tls));
  ASSERT_TRUE(tx.ok()) << tx.status().ToString();
  p->rx = std::move(rx).value();
  p->tx = std::move(tx).value();
  auto a = p->rx->Allocate(kBytes);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  p->allocated = std::move(a).value();
  std::memset(p->allocated->region().addr, 0, kBytes);
  auto r = p->rx->Register(MemoryRegion{p->host.data(), kBytes});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  p->registered = std::move(r).value();
  PeerDescriptor d;
  d.address = p->rx->LocalAddress();
  for (Registration* reg : {p->allocated.get(), p->registered.get()}) {
    d.regions.push_back({reinterpret_cast<uint64_t>(reg->region().addr), reg->region().length, reg->RemoteKey()});
  }
  auto ep = test::ConnectAdmitted(*p->tx, *p->rx, d);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  p->ep = std::move(ep).value();
}

TEST(UcxPeerMapping, AllocatedRegionIsMappedAndOutlivesTheEndpoint) {
  if (!SameHostCopiesPossible()) GTEST_SKIP() << "no boot id / pidfd_open / process_vm_readv here";
  Pair p;
  ASSERT_NO_FATAL_FAILURE(MakePair("sm,tcp", &p));
  auto m = ucx::MapPeerRegion(*p.ep, 0);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ((*m)->length(), kBytes);
  ASSERT_NE((*m)->data(), p.allocated->region().addr);  // our own mapping, not the peer's address
  std::vector<uint8_t> pattern(kBytes);
  test::FillPattern(pattern.data(), kBytes, 11);
  std::memcpy((*m)->data(), pattern.data(), kBytes);
  EXPECT_EQ(std::memcmp(p.allocated->region().addr, pattern.data(), kBytes), 0);
  // The endpoint goes; the mapping stays usable (and is ours to unmap).
  p.ep.reset();
  test::FillPattern(pattern.data(), kBytes, 12);
  std::memcpy((*m)->data(), pattern.data(), kBytes);
  EXPECT_EQ(std::memcmp(p.allocated->region().addr, pattern.data(), kBytes), 0);
  m->reset();
  // The peer's memory is untouched by our unmapping.
  EXPECT_EQ(std::memcmp(p.allocated->region().addr, pattern.data(), kBytes), 0);
}

TEST(UcxPeerMapping, RefusedWithoutASameHostMapping) {
  if (!SameHostCopiesPossible()) GTEST_SKIP() << "no boot id / pidfd_open / process_vm_readv here";
  Pair p;
  ASSERT_NO_FATAL_FAILURE(MakePair("sm,tcp", &p));
  auto reg = ucx::MapPeerRegion(*p.ep, 1);  // memory the peer registered: no memfd
  ASSERT_FALSE(reg.ok());
  EXPECT_EQ(reg.status().code(), StatusCode::kNotSupported) << reg.status().ToString();
  auto out = ucx::MapPeerRegion(*p.ep, 2);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  out = ucx::MapPeerRegion(*p.ep, -1);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);

  Pair tcp;  // shared memory not admitted by UCX_TLS: no same-host path at all
  ASSERT_NO_FATAL_FAILURE(MakePair("tcp", &tcp));
  auto none = ucx::MapPeerRegion(*tcp.ep, 0);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotSupported) << none.status().ToString();
}

TEST(UcxPeerMapping, OtherBackendsEndpointIsRefused) {
  auto fake = CreateTransport(test::Options("fake"));
  ASSERT_TRUE(fake.ok()) << fake.status().ToString();
  std::vector<uint8_t> mem(4096);
  auto reg = (*fake)->Register(MemoryRegion{mem.data(), mem.size()});
  ASSERT_TRUE(reg.ok());
  PeerDescriptor d;
  d.address = (*fake)->LocalAddress();
  d.regions.push_back({reinterpret_cast<uint64_t>(mem.data()), mem.size(), (*reg)->RemoteKey()});
  auto ep = (*fake)->Connect(d);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  auto m = ucx::MapPeerRegion(**ep, 0);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotSupported);
}

}  // namespace

// A UCX built with CUDA before 1.16 puts from device memory with a host memcpy (it crashed on
// the H200: bench/results/ucx_cuda_2026-12-01.md), so CUDA memory moves as active-message
// rendezvous, which 1.13 lands memory-type-aware; older releases were not tried, and without
// CUDA in the context ResolveBackend sends GPU pools through ucx_staged.
TEST(UcxCudaMemory, ClaimedFromUcx113WithCudaInTheContext) {
  EXPECT_FALSE(ucx::MovesCudaMemory(1, 12, true));
  EXPECT_TRUE(ucx::MovesCudaMemory(1, 13, true));
  EXPECT_TRUE(ucx::MovesCudaMemory(1, 15, true));
  EXPECT_TRUE(ucx::MovesCudaMemory(1, 16, true));
  EXPECT_TRUE(ucx::MovesCudaMemory(1, 18, true));
  EXPECT_TRUE(ucx::MovesCudaMemory(2, 0, true));
  EXPECT_FALSE(ucx::MovesCudaMemory(1, 18, false));
}

// ucx_staged's inner transport leaves UCX's CUDA transports out of any selection.
TEST(UcxTls, WithoutCudaKeepsTheRestOfTheSelection) {
  EXPECT_EQ(ucx::TlsWithoutCuda("tcp,cuda_copy"), "tcp");
  EXPECT_EQ(ucx::TlsWithoutCuda("sm,tcp"), "sm,tcp");
  EXPECT_EQ(ucx::TlsWithoutCuda("all"), "^cuda_copy,cuda_ipc,gdr_copy");
  EXPECT_EQ(ucx::TlsWithoutCuda("^sm"), "^sm,cuda_copy,cuda_ipc,gdr_copy");
  EXPECT_EQ(ucx::TlsWithoutCuda("cuda_copy"), "^cuda_copy,cuda_ipc,gdr_copy");
  EXPECT_EQ(ucx::TlsWithoutCuda("tcp,cuda_ipc,cuda_copy,sm"), "tcp,sm");
  // UCX takes the exclusion whether or not it was built with CUDA.
  TransportOptions o;
  o.backend = "ucx";
  o.ucx.tls = ucx::TlsWithoutCuda("all");
  auto t = CreateTransport(o);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_FALSE((*t)->capabilities().cuda_memory);
}

// UCX_TLS=sm alone used to fail at the first Connect with UCX's "no peer failure handler"
// errors and "Destination is unreachable"; the transport now says why when it is made.
TEST(UcxTls, SharedMemoryOnlySelectionsAreRecognised) {
  for (const char* tls : {"sm", "shm", "posix,sysv,cma", "sm,self"}) {
    EXPECT_TRUE(ucx::TlsLacksPeerFailureTransport(tls)) << tls;
  }
  for (const char* tls : {"", "tcp", "sm,tcp", "^sm", "rc,sm", "all"}) {
    EXPECT_FALSE(ucx::TlsLacksPeerFailureTransport(tls)) << tls;
  }
}

}  // namespace kvstream::transport
