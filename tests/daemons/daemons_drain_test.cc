// Health per service name (on the plaintext health-only listener) and the graceful drain after
// SIGTERM, with real daemon processes.
#include <grpcpp/generic/generic_stub.h>

#include <fstream>
#include <future>
#include <thread>

#include "tests/daemons/disagg_fixture.h"
#include "tests/fault_record.h"

namespace kvstream::testing {
namespace {

namespace v1 = kvstream::v1;

const std::vector<std::string> kTiny = {"--model=tiny"};

// grpc.health.v1.Health/Check by hand (no generated stub in this build): the status enum
// (1 SERVING, 2 NOT_SERVING), or -1 with *rpc set when the call failed (NOT_FOUND: unknown name).
int HealthStatus(const std::string& address, const std::string& service,
                 grpc::Status* rpc = nullptr) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  std::string req;
  if (!service.empty()) {
    req.push_back(0x0a);  // field 1, length-delimited
    req.push_back(static_cast<char>(service.size()));
    req += service;
  }
  grpc::Slice slice(req);
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) { done.set_value(s); });
  grpc::Status s = done.get_future().get();
  if (rpc) *rpc = s;
  if (!s.ok()) return -1;
  std::vector<grpc::Slice> slices;
  response.Dump(&slices);
  std::string bytes;
  for (auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  return bytes.size() >= 2 && bytes[0] == 0x08 ? bytes[1] : 0;
}

constexpr int kServing = 1, kNotServing = 2;

// Polls until the status of `service` at `address` is `want` (true) or the deadline passes.
bool WaitHealth(const std::string& address, const std::string& service, int want, int ms) {
  for (auto d = DeadlineAfterMs(ms); Clock::now() < d;) {
    if (HealthStatus(address, service) == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

int ReadPort(const std::string& path) {
  for (auto d = DeadlineAfterMs(10000); Clock::now() < d;) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port) return port;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 0;
}

std::future<GenerateResult> AsyncGenerate(const std::string& address, std::vector<int32_t> prompt,
                                          int max_tokens, v1::LoadMode mode, int deadline_ms) {
  return std::async(std::launch::async, [=] {
    return CallGenerate(*DecodeStub(address), prompt, max_tokens, mode, deadline_ms);
  });
}

void WaitForDecodeInFlight(const std::string& address, int n) {
  auto stub = DecodeStub(address);
  for (auto d = DeadlineAfterMs(10000); Clock::now() < d;) {
    auto st = CallStats(*stub, 1000);
    if (st.ok() && st->requests_in_flight() >= n) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  FAIL() << "the decode never had " << n << " requests in flight";
}

class DrainTest : public DisaggTest {
 protected:
  // Health-only listeners for both daemons; their addresses once started.
  void AddHealthListeners(DaemonPair* pair) {
    pair->prefill.push_back("--health_listen=127.0.0.1:0");
    pair->prefill.push_back("--health_port_file=" + dir_.path() + "/prefill.hport");
    pair->decode.push_back("--health_listen=127.0.0.1:0");
    pair->decode.push_back("--health_port_file=" + dir_.path() + "/decode.hport");
  }
  std::string Health(const std::string& role) {
    return "127.0.0.1:" + std::to_string(ReadPort(dir_.path() + "/" + role + ".hport"));
  }
};

TEST_F(DrainTest, HealthPerServiceOnTheHealthListenerFollowsThePrefill) {
  DaemonPair pair;
  pair.common = kTiny;
  pair.prefill_port = PickFreePort();  // the prefill comes back on the same port
  AddHealthListeners(&pair);
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  const std::string dh = Health("decode"), ph = Health("prefill");
  EXPECT_EQ(HealthStatus(dh, ""), kServing);
  EXPECT_TRUE(WaitHealth(dh, "kvstream.v1.Decode", kServing, 3000));
  EXPECT_EQ(HealthStatus(ph, ""), kServing);
  EXPECT_EQ(HealthStatus(ph, "kvstream.v1.Prefill"), kServing);
  // The same statuses on the daemons' own ports; other names are unknown.
  EXPECT_EQ(HealthStatus(decode_address(), "kvstream.v1.Decode"), kServing);
  grpc::Status rpc;
  EXPECT_EQ(HealthStatus(dh, "kvstream.v1.Prefill", &rpc), -1);
  EXPECT_EQ(rpc.error_code(), grpc::StatusCode::NOT_FOUND);
  // The health listener serves nothing else.
  auto on_health_port = CallStats(*DecodeStub(dh));
  EXPECT_FALSE(on_health_port.ok());

  // The prefill dies (on_load_failure=fail): once a load fails and a handshake with it fails,
  // the decode is not ready; the process itself still is.
  prefill_->Signal(SIGKILL);
  prefill_->Wait(DeadlineAfterMs(5000));
  CallGenerate(*stub_, MakePrompt(20, 512, 1), 2, v1::LOAD_MODE_PIPELINED, 5000);
  EXPECT_TRUE(WaitHealth(dh, "kvstream.v1.Decode", kNotServing, 3000))
      << HealthStatus(dh, "kvstream.v1.Decode");
  EXPECT_EQ(HealthStatus(dh, ""), kServing);
  // It comes back: ready again once the prober's handshake succeeds.
  pair_.prefill = {};
  ASSERT_NO_FATAL_FAILURE(StartPrefill());
  const bool back = WaitHealth(dh, "kvstream.v1.Decode", kServing, 5000);
  EXPECT_TRUE(back);
  FaultOutcome o;
  o.requests = 1;
  o.lost = 0;
  o.blocks_leaked = BlocksNotFree(decode_address(), true, DeadlineAfterMs(5000));
  o.aborts = decode_->Running() ? 0 : 1;
  o.outcome = std::string("decode readiness NOT_SERVING while the prefill was gone, liveness "
                          "SERVING; ") + (back ? "SERVING again" : "not SERVING") +
              " once the prefill came back";
  RecordFault("health.prefill_lost", "the decode's only prefill SIGKILLed (on_load_failure=fail)", o);
}

TEST_F(DrainTest, SigtermLetsTheStreamInFlightFinishAndRefusesNewRequestsAfterTheDelay) {
  DaemonPair pair;
  pair.common = kTiny;
  pair.prefill = {"--fault_layer_delay_ms=1500"};  // the stream is in flight for 3 s at least
  pair.decode = {"--drain_delay_ms=1500", "--drain_grace_ms=20000"};
  AddHealthListeners(&pair);
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  const std::string dh = Health("decode");
  const auto prompt = MakePrompt(60, 512, 5);
  auto stream = AsyncGenerate(decode_address(), prompt, 400, v1::LOAD_MODE_PIPELINED, 30000);
  ASSERT_NO_FATAL_FAILURE(WaitForDecodeInFlight(decode_address(), 1));
  const auto t0 = Clock::now();
  decode_->Signal(SIGTERM);
  // Within the delay a new request is still taken (it is answered once the stream's first
  // step, which follows the slow prefill, is done)...
  auto early = AsyncGenerate(decode_address(), MakePrompt(5, 512, 6), 2, v1::LOAD_MODE_LOCAL, 10000);
  // Readiness goes first; liveness stays.
  EXPECT_TRUE(WaitHealth(dh, "kvstream.v1.Decode", kNotServing, 1400));
  EXPECT_EQ(HealthStatus(dh, ""), kServing);
  // ...after it, refused.
  std::this_thread::sleep_until(t0 + std::chrono::milliseconds(1900));
  GenerateResult late = CallGenerate(*stub_, MakePrompt(5, 512, 7), 2, v1::LOAD_MODE_LOCAL, 5000);
  EXPECT_EQ(late.status.error_code(), grpc::StatusCode::UNAVAILABLE) << late.status.error_message();
  GenerateResult e = early.get();
  EXPECT_TRUE(e.status.ok()) << e.status.error_message();
  // The stream in flight completes, every token.
  GenerateResult r = stream.get();
  ASSERT_TRUE(r.status.ok()) << r.status.error_message() << "\n" << decode_->Log();
  EXPECT_EQ(r.tokens, Colocated(kTiny, prompt, 400));
  const int rc = decode_->Wait(DeadlineAfterMs(10000));
  EXPECT_EQ(rc, 0) << decode_->Log();
  EXPECT_NE(decode_->Log().find("drained: nothing in flight"), std::string::npos);
  FaultOutcome o;
  o.requests = 3;
  o.lost = (r.status.ok() ? 0 : 1) + (e.status.ok() ? 0 : 1) +
           (late.status.error_code() == grpc::StatusCode::UNAVAILABLE ? 0 : 1);
  o.wrong_tokens = r.tokens == Colocated(kTiny, prompt, 400) ? 0 : 1;
  o.aborts = rc == 0 ? 0 : 1;
  o.outcome = "readiness NOT_SERVING at once; a request within drain_delay_ms served, one after "
              "it UNAVAILABLE; the 400-token stream in flight completed; exit 0";
  RecordFault("drain.decode_sigterm_long_stream", "decode SIGTERMed with a 400-token stream in flight", o);
}

TEST_F(DrainTest, PrefillDrainFinishesItsWritesThenStops) {
  DaemonPair pair;
  pair.common = kTiny;
  pair.prefill = {"--fault_layer_delay_ms=600", "--drain_grace_ms=20000"};
  AddHealthListeners(&pair);
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  const std::string ph = Health("prefill");
  const auto prompt = MakePrompt(40, 512, 8);
  auto stream = AsyncGenerate(decode_address(), prompt, 8, v1::LOAD_MODE_PIPELINED, 30000);
  auto pstub = PrefillStub(prefill_address());
  for (auto d = DeadlineAfterMs(10000); Clock::now() < d;) {
    auto st = CallStats(*pstub, 1000);
    if (st.ok() && st->requests_in_flight() > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  prefill_->Signal(SIGTERM);
  EXPECT_TRUE(WaitHealth(ph, "kvstream.v1.Prefill", kNotServing, 1500));
  GenerateResult r = stream.get();
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, Colocated(kTiny, prompt, 8));
  EXPECT_TRUE(r.messages.front().load().loaded_remotely());
  const int rc = prefill_->Wait(DeadlineAfterMs(10000));
  EXPECT_EQ(rc, 0) << prefill_->Log();
  EXPECT_NE(prefill_->Log().find("blocks free"), std::string::npos);
  FaultOutcome o;
  o.requests = 1;
  o.lost = r.status.ok() ? 0 : 1;
  o.wrong_tokens = r.tokens == Colocated(kTiny, prompt, 8) ? 0 : 1;
  o.blocks_leaked = BlocksNotFree(decode_address(), true, DeadlineAfterMs(5000));
  o.aborts = rc == 0 && decode_->Running() ? 0 : 1;
  o.outcome = "the prefill finished the load it was computing (loaded remotely, right tokens), "
              "then exited 0";
  RecordFault("drain.prefill_sigterm_mid_load", "prefill SIGTERMed while it computes a load", o);
}

TEST_F(DrainTest, SecondSigtermStopsAtOnce) {
  DaemonPair pair;
  pair.common = kTiny;
  pair.prefill = {"--fault_layer_delay_ms=3000"};
  pair.decode = {"--drain_grace_ms=25000"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  auto stream = AsyncGenerate(decode_address(), MakePrompt(30, 512, 9), 50,
                              v1::LOAD_MODE_PIPELINED, 30000);
  ASSERT_NO_FATAL_FAILURE(WaitForDecodeInFlight(decode_address(), 1));
  decode_->Signal(SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(decode_->Running()) << "the first SIGTERM must drain, not stop";
  const auto t0 = Clock::now();
  decode_->Signal(SIGTERM);
  EXPECT_EQ(decode_->Wait(DeadlineAfterMs(8000)), 0) << decode_->Log();
  EXPECT_LT(SecondsSince(t0), 5.0);  // the cancellation's bound (cancel_timeout_ms), not the grace
  const double stopped_in = SecondsSince(t0);
  GenerateResult r = stream.get();
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  FaultOutcome o;
  o.tries = 2;
  o.requests = 1;
  o.lost = r.status.error_code() == grpc::StatusCode::UNAVAILABLE ? 0 : 1;
  o.aborts = 0;
  char buf[128];
  std::snprintf(buf, sizeof(buf), "the first SIGTERM drained, the second stopped the decode in "
                "%.2f s (exit 0), the stream ended UNAVAILABLE", stopped_in);
  o.outcome = buf;
  RecordFault("drain.second_sigterm", "a second SIGTERM during a drain with 25 s of grace", o);
}

}  // namespace
}  // namespace kvstream::testing
