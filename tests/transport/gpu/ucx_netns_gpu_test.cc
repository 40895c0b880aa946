// The UCX backend moving CUDA memory across a network hop (label gpu): the receiver process runs
// in a network namespace of its own, joined to the writer's by a veth pair (tests/veth_pair.h);
// each side pins UCX to its end of the pair and UCX_TLS=tcp,cuda_copy (the network path, where
// UCX stages GPU memory through host buffers itself). Checked: the transports UCX chose
// (ucp_ep_print_info: TCP over the veth, no same-host transport), scattered layers landing
// byte-exact before their notification, a write behind a producer stream, and a killed receiver
// failing the writer's endpoint with kRemoteDisconnect.
//
// Skipped (exit 77, the reason printed) without a GPU, without a UCX built with CUDA
// (scripts/install-deps.sh --ucx-cuda), without root or without iproute2's `ip`.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "common/time.h"
#include "tests/transport/gpu/gpu_peer.h"
#include "tests/transport/gpu/gpu_peer_test.h"
#include "tests/veth_pair.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_transport.h"

namespace kvstream::testing {
namespace {

using transport::Registration;
using transport::Transport;
using transport::WriteRequest;

constexpr const char* kTls = "tcp,cuda_copy";

VethPair& Net() {
  static VethPair pair("kvu", 10);
  return pair;
}

Result<std::unique_ptr<Transport>> MakeUcx(const std::string& device) {
  transport::TransportOptions o;
  o.backend = "ucx";
  o.ucx.tls = kTls;
  o.ucx.net_devices = device;
  auto t = transport::CreateTransport(o);
  if (t.ok() && !(*t)->capabilities().cuda_memory) {
    return NotSupported("this UCX moves no CUDA memory (scripts/install-deps.sh --ucx-cuda)");
  }
  return t;
}

void OpenNetLink(Link* l) {
  OpenLink({"--helper=receiver", "--netns=" + Net().Path(), "--dev=" + Net().inner}, 20000,
           [] { return MakeUcx(Net().outer); }, l);
}

TEST(UcxCudaAcrossNamespaces, UcxUsesTcpOverTheVethAndTheBytesLand) {
  Link l;
  ASSERT_NO_FATAL_FAILURE(OpenNetLink(&l));
  void* src = nullptr;
  std::unique_ptr<Registration> reg;
  WriteRequest wr;
  ASSERT_NO_FATAL_FAILURE(LandCheckedWrite(l, 10000, &src, &reg, &wr));
  auto info = transport::ucx::DescribeEndpoint(*l.ep);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  std::printf("ucp_ep_print_info (UCX_TLS=%s):\n%s\n", kTls, info->c_str());
  EXPECT_NE(info->find("tcp/" + Net().outer), std::string::npos) << "no TCP lane on the veth";
  for (const char* other : {"cuda_ipc", "posix", "sysv", "cma", "tcp/lo", "rc_", "ud_"}) {
    EXPECT_EQ(info->find(other), std::string::npos) << "UCX chose " << other;
  }
  ASSERT_NO_FATAL_FAILURE(CloseLink(l, 10000));
  reg.reset();
  cudaFree(src);
}

TEST(UcxCudaAcrossNamespaces, ScatteredLayersLandByteExactBeforeTheirNotification) {
  Link l;
  ASSERT_NO_FATAL_FAILURE(OpenNetLink(&l));
  WriteScatteredLayers(l, 1000, 20000, 10000, /*expect_split=*/false);
}

TEST(UcxCudaAcrossNamespaces, WriteWaitsForTheProducerStream) {
  Link l;
  ASSERT_NO_FATAL_FAILURE(OpenNetLink(&l));
  WriteAfterProducerStream(l, 2000, 20000, 10000);
}

TEST(UcxCudaAcrossNamespaces, KilledReceiverFailsTheEndpoint) {
  Link l;
  ASSERT_NO_FATAL_FAILURE(OpenNetLink(&l));
  void* src = nullptr;
  std::unique_ptr<Registration> reg;
  WriteRequest wr;
  ASSERT_NO_FATAL_FAILURE(LandCheckedWrite(l, 10000, &src, &reg, &wr));
  l.rx.proc.Kill();
  const auto killed = Clock::now();
  Status failure;
  while (failure.ok() && SecondsSince(killed) < 10.0) {
    if (Status st = l.ep->status(); !st.ok()) {
      failure = st;
      break;
    }
    auto h = l.ep->Write(wr);
    if (!h.ok()) {
      failure = h.status();
      break;
    }
    Status s = h.value()->Wait(DeadlineAfterMs(500));
    if (!s.ok() && s.code() != StatusCode::kTimeout) failure = s;
  }
  ASSERT_FALSE(failure.ok()) << "the receiver's death was not reported within 10 s";
  EXPECT_EQ(failure.code(), StatusCode::kRemoteDisconnect) << failure.ToString();
  std::printf("peer loss surfaced after %.1f ms\n", SecondsSince(killed) * 1e3);
  const auto t_close = Clock::now();
  l.ep.reset();
  EXPECT_LT(SecondsSince(t_close), 12.0) << "closing an endpoint to a dead peer must be bounded";
  reg.reset();
  cudaFree(src);
}

// The receiver: enters the namespace, then serves as the conformance suite's receiver does.
int RunReceiver(const std::string& netns, const std::string& device) {
  if (std::string why = EnterNetns(netns); !why.empty()) {
    PeerSay("ERROR entering the namespace: " + why);
    return 1;
  }
  if (cudaSetDevice(0) != cudaSuccess) {
    PeerSay("ERROR cudaSetDevice 0");
    return 1;
  }
  return ServeAsReceiver(
      MakeUcx(device), 0, kPeerRegions, kPeerRegionBytes, /*host_memory=*/false,
      [](const ReceiverPool& pool) { return CheckingSink(pool, 0); }, HashCommand);
}

}  // namespace
}  // namespace kvstream::testing

int main(int argc, char** argv) {
  using namespace kvstream::testing;
  std::string helper, netns, dev;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--helper=", 0) == 0) helper = a.substr(9);
    if (a.rfind("--netns=", 0) == 0) netns = a.substr(8);
    if (a.rfind("--dev=", 0) == 0) dev = a.substr(6);
  }
  if (helper == "receiver") return RunReceiver(netns, dev);
  ::testing::InitGoogleTest(&argc, argv);
  if (::testing::GTEST_FLAG(list_tests)) return RUN_ALL_TESTS();
  int count = 0;
  if (!GpusUsable("ucx_netns_gpu_test", &count)) return 77;
  {
    auto probe = MakeUcx("");
    if (!probe.ok()) {
      std::printf("SKIPPED: %s\n", probe.status().ToString().c_str());
      return 77;
    }
  }
  if (std::string why = Net().SetUp(); !why.empty()) {
    std::printf("SKIPPED: %s\n", why.c_str());
    return 77;
  }
  const int rc = RUN_ALL_TESTS();
  Net().TearDown();
  return rc;
}
