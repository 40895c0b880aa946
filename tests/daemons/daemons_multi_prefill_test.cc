// One decode daemon with two prefill daemons (--peer a,b): loads are spread over both, a killed
// prefill is skipped (its in-flight loads recomputed), and one that comes back on its port takes
// loads again. Real processes, real gRPC and UCX on loopback, tiny model on the CPU.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>
#include <thread>

#include "tests/daemons/disagg_fixture.h"

namespace kvstream::testing {
namespace {

class MultiPrefillTest : public DisaggTest {
 protected:
  std::unique_ptr<DaemonProcess> StartPrefillOn(const std::string& name, int port) {
    std::vector<std::string> args = DefaultDaemonFlags();
    for (const char* a : {"--model=tiny", "--pool_blocks=64"}) args.push_back(a);
    args.push_back("--listen=127.0.0.1:" + std::to_string(port));
    auto p = std::make_unique<DaemonProcess>(name, PrefillBin(), args, dir_.path());
    Status s = p->Start(DeadlineAfterMs(60000));
    EXPECT_TRUE(s.ok()) << s.ToString();
    return s.ok() ? std::move(p) : nullptr;
  }
  void TearDown() override {
    if (HasFailure()) {
      for (auto* p : {&a, &b})
        if (*p) std::fprintf(stderr, "---- %s log ----\n%s\n", p == &a ? "prefill a" : "prefill b",
                             (*p)->Log().c_str());
    }
    DisaggTest::TearDown();
  }
  // Members, so that a failure prints their logs.
  std::unique_ptr<DaemonProcess> a, b;
  uint64_t PrefillOk(const std::string& address) {
    auto stub = PrefillStub(address);
    auto st = CallStats(*stub);
    return st.ok() ? st->counters().requests_ok() : 0;
  }
};

TEST_F(MultiPrefillTest, LoadsSpreadOverBothAndSurviveOneDying) {
  const int port_a = PickFreePort(), port_b = PickFreePort();
  a = StartPrefillOn("prefill_a", port_a);
  b = StartPrefillOn("prefill_b", port_b);
  ASSERT_TRUE(a && b);
  std::vector<std::string> args = DefaultDaemonFlags();
  for (const char* f : {"--model=tiny", "--pool_blocks=256", "--on_load_failure=recompute"})
    args.push_back(f);
  args.push_back("--listen=127.0.0.1:0");
  args.push_back("--peer=127.0.0.1:" + std::to_string(port_a) + ",127.0.0.1:" +
                 std::to_string(port_b));
  decode_ = std::make_unique<DaemonProcess>("decode", DecodeBin(), args, dir_.path());
  ASSERT_TRUE(decode_->Start(DeadlineAfterMs(60000)).ok());
  stub_ = DecodeStub(decode_->address());

  // Spread: 8 requests one after another land on both prefills; tokens equal colocated.
  const std::vector<int32_t> prompt = MakePrompt(40, 512, 5);
  const std::vector<int32_t> want = Colocated({"--model=tiny"}, prompt, 5);
  for (int i = 0; i < 8; ++i) {
    auto r = CallGenerate(*stub_, prompt, 5, v1::LOAD_MODE_PIPELINED, 30000);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, want);
    ASSERT_FALSE(r.messages.empty());
    EXPECT_TRUE(r.messages.front().load().loaded_remotely()) << "request " << i;
  }
  const uint64_t a_before = PrefillOk("127.0.0.1:" + std::to_string(port_a));
  const uint64_t b_before = PrefillOk("127.0.0.1:" + std::to_string(port_b));
  EXPECT_EQ(a_before + b_before, 8u);
  EXPECT_GE(a_before, 2u) << "loads did not spread";
  EXPECT_GE(b_before, 2u) << "loads did not spread";

  // Prefill A dies: every request still gets its tokens (recomputed if its load was on A), and
  // once A is known lost, loads go to B.
  a->Signal(SIGKILL);
  a->Wait(DeadlineAfterMs(10000));
  int remote_after = 0;
  for (int i = 0; i < 8; ++i) {
    auto r = CallGenerate(*stub_, prompt, 5, v1::LOAD_MODE_PIPELINED, 30000);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, want);
    if (!r.messages.empty() && r.messages.front().load().loaded_remotely()) ++remote_after;
  }
  EXPECT_GE(remote_after, 6) << "B did not take the loads after A died";
  EXPECT_GE(PrefillOk("127.0.0.1:" + std::to_string(port_b)), b_before + 6);

  // A comes back on its port: the decode's prober handshakes again and A takes loads.
  a = StartPrefillOn("prefill_a2", port_a);
  ASSERT_TRUE(a);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  for (int i = 0; i < 8; ++i) {
    auto r = CallGenerate(*stub_, prompt, 5, v1::LOAD_MODE_PIPELINED, 30000);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, want);
  }
  EXPECT_GE(PrefillOk("127.0.0.1:" + std::to_string(port_a)), 2u) << "A did not take loads again";
  EXPECT_TRUE(WaitForAllBlocksFree(decode_->address(), true, DeadlineAfterMs(10000)).ok());
}

TEST_F(MultiPrefillTest, MalformedPeerListIsRefusedAtStart) {
  for (const char* peers : {"127.0.0.1:1,", "127.0.0.1:1,,127.0.0.1:2", "127.0.0.1"}) {
    std::vector<std::string> args = DefaultDaemonFlags();
    args.push_back("--model=tiny");
    args.push_back("--listen=127.0.0.1:0");
    args.push_back(std::string("--peer=") + peers);
    DaemonProcess d("decode_bad", DecodeBin(), args, dir_.path());
    ASSERT_TRUE(d.Spawn().ok());
    EXPECT_EQ(d.Wait(DeadlineAfterMs(20000)), 2) << peers << "\n" << d.Log();
    EXPECT_NE(d.Log().find("host:port"), std::string::npos) << d.Log();
  }
}

}  // namespace
}  // namespace kvstream::testing
