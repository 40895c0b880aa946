// Fault tests: a peer killed or stopped while requests are in flight; blocks always come back.
#include <future>
#include <thread>

#include "tests/daemons/disagg_fixture.h"
#include "tests/fault_record.h"

namespace kvstream::testing {
namespace {

namespace v1 = kvstream::v1;

const std::vector<std::string> kTiny = {"--model=tiny"};

std::future<GenerateResult> AsyncGenerate(const std::string& address, std::vector<int32_t> prompt,
                                          int max_tokens, v1::LoadMode mode, int deadline_ms) {
  return std::async(std::launch::async, [=] {
    auto stub = DecodeStub(address);
    return CallGenerate(*stub, prompt, max_tokens, mode, deadline_ms);
  });
}

// Waits until the prefill reports a request in flight (so a kill lands mid-request).
void WaitForPrefillBusy(const std::string& address) {
  auto stub = PrefillStub(address);
  auto deadline = DeadlineAfterMs(10000);
  while (Clock::now() < deadline) {
    auto st = CallStats(*stub, 1000);
    if (st.ok() && st->requests_in_flight() > 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  FAIL() << "prefill never got busy";
}

// Waits until the decode has admitted n requests (so a signal finds all of them in flight,
// not some still queued in gRPC, which a server shutdown answers with CANCELLED).
void WaitForDecodeInFlight(const std::string& address, int n) {
  auto stub = DecodeStub(address);
  auto deadline = DeadlineAfterMs(10000);
  while (Clock::now() < deadline) {
    auto st = CallStats(*stub, 1000);
    if (st.ok() && st->requests_in_flight() >= n) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  FAIL() << "the decode never had " << n << " requests in flight";
}

TEST_F(DisaggTest, PrefillKilledMidRequestFailsClearlyThenDecodeRecovers) {
  DaemonPair pair;
  pair.common = kTiny;
  pair.prefill = {"--fault_layer_delay_ms=400"};
  pair.prefill_port = PickFreePort();  // the restarted prefill comes back on the same port
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  auto prompt = MakePrompt(40, 512, 3);
  const int kDeadlineMs = 15000;
  auto start = Clock::now();
  auto fut = AsyncGenerate(decode_address(), prompt, 4, v1::LOAD_MODE_PIPELINED, kDeadlineMs);
  ASSERT_NO_FATAL_FAILURE(WaitForPrefillBusy(prefill_address()));
  prefill_->Signal(SIGKILL);
  EXPECT_EQ(prefill_->Wait(DeadlineAfterMs(5000)), 128 + SIGKILL);
  GenerateResult r = fut.get();
  const double elapsed = SecondsSince(start);
  EXPECT_FALSE(r.status.ok());
  EXPECT_LT(elapsed, kDeadlineMs / 1000.0);
  EXPECT_NE(r.status.error_message().find("did not land"), std::string::npos)
      << r.status.error_message();
  EXPECT_TRUE(r.tokens.empty());
  Status freed = WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(5000));
  EXPECT_TRUE(freed.ok()) << freed.ToString();

  // Prefill comes back (new instance, same address): decode handshakes again and serves.
  pair_.prefill = {};
  ASSERT_NO_FATAL_FAILURE(StartPrefill());
  GenerateResult ok = CallGenerate(*stub_, prompt, 4, v1::LOAD_MODE_PIPELINED, 30000);
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.tokens, Colocated(kTiny, prompt, 4));
  EXPECT_TRUE(ok.messages.front().load().loaded_remotely());
  auto stats = CallStats(*stub_);
  ASSERT_TRUE(stats.ok());
  EXPECT_GE(stats->counters().handshakes(), 2u);
  FaultOutcome o;
  o.requests = 2;
  o.lost = (r.status.ok() || r.status.error_message().empty()) ? 1 : 0;
  o.wrong_tokens = ok.tokens == Colocated(kTiny, prompt, 4) ? 0 : 1;
  o.blocks_leaked = BlocksNotFree(decode_address(), true, DeadlineAfterMs(5000));
  o.aborts = decode_->Running() ? 0 : 1;
  o.outcome = "the request in flight failed in " + std::to_string(elapsed).substr(0, 4) +
              " s (\"did not land\"), its blocks came back; the restarted prefill served the next";
  RecordFault("prefill.sigkill_mid_request", "prefill SIGKILLed while it computes a request", o);
}

TEST_F(DisaggTest, PrefillStoppedMidRequestIsRecomputedWhenConfigured) {
  DaemonPair pair;
  pair.common = kTiny;
  // No drain grace: the SIGTERM cancels the prefill's request (a drain would finish it).
  pair.prefill = {"--fault_layer_delay_ms=400", "--drain_grace_ms=0"};
  pair.decode = {"--on_load_failure=recompute"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  auto prompt = MakePrompt(50, 512, 4);
  auto fut = AsyncGenerate(decode_address(), prompt, 5, v1::LOAD_MODE_PIPELINED, 20000);
  ASSERT_NO_FATAL_FAILURE(WaitForPrefillBusy(prefill_address()));
  prefill_->Signal(SIGTERM);
  GenerateResult r = fut.get();
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, Colocated(kTiny, prompt, 5));
  EXPECT_TRUE(r.messages.front().load().recomputed());
  // The prefill shut down cleanly: exit 0, every block free.
  EXPECT_EQ(prefill_->Wait(DeadlineAfterMs(10000)), 0) << prefill_->Log();
  EXPECT_NE(prefill_->Log().find("blocks free"), std::string::npos);
  Status freed = WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(5000));
  EXPECT_TRUE(freed.ok()) << freed.ToString();
  FaultOutcome o;
  o.requests = 1;
  o.lost = r.status.ok() ? 0 : 1;
  o.wrong_tokens = r.status.ok() && r.tokens == Colocated(kTiny, prompt, 5) ? 0 : 1;
  o.blocks_leaked = BlocksNotFree(decode_address(), true, DeadlineAfterMs(5000));
  o.aborts = decode_->Running() ? 0 : 1;
  o.outcome = "on_load_failure=recompute: the decode computed the prompt itself, right tokens";
  RecordFault("prefill.sigterm_mid_request_recompute",
              "prefill stopped (SIGTERM, no grace) while it computes a request", o);
}

TEST_F(DisaggTest, DecodeSigtermEndsRequestsInFlightAndFreesEveryBlock) {
  DaemonPair pair;
  pair.common = kTiny;
  pair.common.push_back("--pool_blocks=64");
  pair.prefill = {"--fault_layer_delay_ms=300"};
  // No drain grace: what is in flight at the SIGTERM is cancelled (daemons_drain_test: with it).
  pair.decode = {"--drain_grace_ms=0"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  std::vector<std::future<GenerateResult>> futs;
  for (int i = 0; i < 4; ++i)
    futs.push_back(AsyncGenerate(decode_address(), MakePrompt(30 + i, 512, 50 + i), 50,
                                 v1::LOAD_MODE_PIPELINED, 20000));
  ASSERT_NO_FATAL_FAILURE(WaitForPrefillBusy(prefill_address()));
  ASSERT_NO_FATAL_FAILURE(WaitForDecodeInFlight(decode_address(), 4));
  decode_->Signal(SIGTERM);
  int unclear = 0;
  for (auto& f : futs) {
    GenerateResult r = f.get();
    EXPECT_FALSE(r.status.ok());
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
    if (r.status.error_code() != grpc::StatusCode::UNAVAILABLE) ++unclear;
  }
  EXPECT_EQ(decode_->Wait(DeadlineAfterMs(15000)), 0) << decode_->Log();
  std::string log = decode_->Log();
  EXPECT_NE(log.find("stopped; 64/64 blocks free"), std::string::npos) << log;
  // The prefill was told to stop (or finished); its pool is whole again.
  Status freed = WaitForAllBlocksFree(prefill_address(), false, DeadlineAfterMs(10000));
  EXPECT_TRUE(freed.ok()) << freed.ToString();
  FaultOutcome o;
  o.requests = 4;
  o.lost = unclear;
  o.blocks_leaked = (log.find("stopped; 64/64 blocks free") == std::string::npos ? 1 : 0) +
                    BlocksNotFree(prefill_address(), false, DeadlineAfterMs(5000));
  o.aborts = 0;
  o.outcome = "no drain grace: every request in flight ended UNAVAILABLE, the decode exited 0 "
              "with 64/64 blocks free, the prefill's pool whole";
  RecordFault("decode.sigterm_in_flight", "decode SIGTERMed (drain_grace_ms=0) with 4 requests in flight", o);
}

TEST_F(DisaggTest, ClientCancelAndDeadlineFreeBlocks) {
  DaemonPair pair;
  pair.common = kTiny;
  pair.prefill = {"--fault_layer_delay_ms=300"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  // A deadline shorter than the (slowed) prefill: DEADLINE_EXCEEDED, blocks back.
  GenerateResult r = CallGenerate(*stub_, MakePrompt(20, 512, 9), 4, v1::LOAD_MODE_PIPELINED, 250);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  Status d = WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(8000));
  EXPECT_TRUE(d.ok()) << d.ToString();
  Status p = WaitForAllBlocksFree(prefill_address(), false, DeadlineAfterMs(8000));
  EXPECT_TRUE(p.ok()) << p.ToString();
  // And the daemons still serve.
  auto prompt = MakePrompt(20, 512, 9);
  r = CallGenerate(*stub_, prompt, 4, v1::LOAD_MODE_PIPELINED, 20000);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, Colocated(kTiny, prompt, 4));
  FaultOutcome o;
  o.requests = 2;
  o.lost = 0;
  o.wrong_tokens = r.tokens == Colocated(kTiny, prompt, 4) ? 0 : 1;
  o.blocks_leaked = (d.ok() ? 0 : 1) + (p.ok() ? 0 : 1);
  o.aborts = decode_->Running() && prefill_->Running() ? 0 : 1;
  o.outcome = "DEADLINE_EXCEEDED; both pools whole again; the next request served right";
  RecordFault("client.deadline_during_load", "client deadline (250 ms) shorter than the prefill", o);
}

}  // namespace
}  // namespace kvstream::testing
