// GPU integration (label gpu): the real kvstream-prefill and kvstream-decode processes, CUDA
// backend, KV pools in device memory, for each GPU transport built in, in two placements:
//  - OneGpu: both daemons on GPU 0 (cuda_ipc, ucx_staged, ucx; nccl cannot put two ranks on a
//    GPU);
//  - TwoGpus: prefill on GPU 0, decode on GPU 1 (nccl, cuda_ipc through peer copies, ucx_staged
//    through host staging, ucx); skipped with the reason where fewer than two GPUs are visible.
// ucx (UCX moving the GPU memory itself) runs only with a UCX built with CUDA (skipped, with the
// reason, otherwise).
// Disaggregated tokens (pipelined and not) must equal the decode daemon computing the prompt
// itself on its own GPU (LOAD_MODE_LOCAL, the colocated path), every block must be back
// afterwards, and both daemons must report the transport asked for. A fault case kills the
// prefill mid-load: the decode's request fails with a clear status in bounded time, its blocks
// come back, and a restarted prefill serves again. The KV tier cases (one GPU, cuda_ipc): the
// prefill's pinned host tier, a disk tier below it, and the decode's write-down from its GPU
// pool to a real redis-server (skipped where redis-server is not on PATH). Exits 77 (skipped)
// with the reason when no usable GPU is present.
#include <cuda_runtime_api.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <ostream>
#include <thread>

#include "tests/daemons/disagg_fixture.h"
#include "tests/kvcache/redis_server.h"
#include "transport/transport.h"

namespace kvstream::testing {
namespace {

namespace v1 = kvstream::v1;

int g_devices = 0;  // CUDA devices visible to this process (main)

bool OnPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  for (size_t b = 0; b <= dirs.size();) {
    size_t e = dirs.find(':', b);
    if (e == std::string::npos) e = dirs.size();
    const std::string file = dirs.substr(b, e - b) + "/" + program;
    if (e > b && ::access(file.c_str(), X_OK) == 0) return true;
    b = e + 1;
  }
  return false;
}

struct GpuCase {
  std::string transport;
  int prefill_device = 0;
  int decode_device = 0;
};

std::ostream& operator<<(std::ostream& os, const GpuCase& c) {
  return os << c.transport << " (prefill cuda:" << c.prefill_device << ", decode cuda:"
            << c.decode_device << ")";
}

constexpr const char* kUcxCudaTls = "tcp,cuda_copy";

class DaemonsGpuTest : public DisaggTest, public ::testing::WithParamInterface<GpuCase> {
 protected:
  const std::string& transport() const { return GetParam().transport; }

  void SetUp() override {
    const GpuCase& c = GetParam();
    auto built = transport::AvailableBackends();
    if (std::find(built.begin(), built.end(), c.transport) == built.end())
      GTEST_SKIP() << "transport " << c.transport << " is not built in";
    if (c.transport == "ucx") {  // GPU pools through UCX itself: a UCX built with CUDA
      transport::TransportOptions o;
      o.backend = "ucx";
      o.ucx.tls = kUcxCudaTls;
      auto t = transport::CreateTransport(o);
      if (!t.ok() || !(*t)->capabilities().cuda_memory)
        GTEST_SKIP() << "this UCX moves no CUDA memory (--transport=ucx resolves to ucx_staged; "
                        "scripts/install-deps.sh --ucx-cuda builds one that does)";
    }
    const int need = std::max(c.prefill_device, c.decode_device) + 1;
    if (g_devices < need)
      GTEST_SKIP() << "needs " << need << " GPUs (prefill on cuda:" << c.prefill_device
                   << ", decode on cuda:" << c.decode_device << "), " << g_devices << " visible";
    if (c.transport == "cuda_ipc" && c.prefill_device != c.decode_device) {
      int can = 0;
      if (cudaDeviceCanAccessPeer(&can, c.prefill_device, c.decode_device) != cudaSuccess || !can)
        GTEST_SKIP() << "cuda:" << c.prefill_device << " cannot access cuda:" << c.decode_device
                     << " as a peer (cuda_ipc across GPUs needs P2P)";
    }
  }

  // Both daemons' flags for this case: CUDA backend, each on its device, the transport.
  DaemonPair Pair(const std::vector<std::string>& model, const std::vector<std::string>& prefill_extra,
                  const std::vector<std::string>& decode_extra) const {
    DaemonPair pair;
    pair.common = model;
    pair.common.push_back("--backend=cuda");
    pair.common.push_back("--transport=" + transport());
    // UCX's CUDA transport beside TCP (the harness pins UCX to tcp).
    if (transport() == "ucx") pair.common.push_back(std::string("--ucx_tls=") + kUcxCudaTls);
    pair.prefill = {"--device=" + std::to_string(GetParam().prefill_device)};
    pair.decode = {"--device=" + std::to_string(GetParam().decode_device)};
    for (const auto& f : prefill_extra) pair.prefill.push_back(f);
    for (const auto& f : decode_extra) pair.decode.push_back(f);
    return pair;
  }

  // Starts the pair with `model` flags, then checks every prompt length: LOCAL first (the
  // reference), then pipelined and non-pipelined loads.
  void RunCase(const std::vector<std::string>& model, const std::vector<std::string>& prefill_extra,
               const std::vector<std::string>& decode_extra, int vocab,
               const std::vector<int>& prompt_lens, int max_tokens) {
    ASSERT_NO_FATAL_FAILURE(StartDaemonsTogether(Pair(model, prefill_extra, decode_extra)));

    auto pstub = PrefillStub(prefill_address());
    auto pstats = CallStats(*pstub, 120000);
    ASSERT_TRUE(pstats.ok()) << pstats.status().ToString();
    EXPECT_EQ(pstats->transport(), transport());
    EXPECT_EQ(pstats->backend(), "cuda:" + std::to_string(GetParam().prefill_device));

    uint64_t seed = 11;
    int remote_loads = 0;
    for (int n : prompt_lens) {
      auto prompt = MakePrompt(n, vocab, seed++);
      auto local = CallGenerate(*stub_, prompt, max_tokens, v1::LOAD_MODE_LOCAL, 120000);
      ASSERT_TRUE(local.status.ok()) << "prompt " << n << ": " << local.status.error_message();
      ASSERT_EQ(local.tokens.size(), size_t(max_tokens));
      for (auto mode : {v1::LOAD_MODE_PIPELINED, v1::LOAD_MODE_NON_PIPELINED}) {
        auto r = CallGenerate(*stub_, prompt, max_tokens, mode, 120000);
        ASSERT_TRUE(r.status.ok()) << "prompt " << n << " mode " << mode << ": "
                                   << r.status.error_message();
        EXPECT_EQ(r.tokens, local.tokens) << GetParam() << ", prompt " << n << ", mode " << mode;
        ASSERT_FALSE(r.messages.empty());
        const auto& load = r.messages.front().load();
        EXPECT_EQ(load.loaded_remotely(), n > 1) << "prompt " << n << " mode " << mode;
        if (n > 1) {
          EXPECT_EQ(load.pipelined(), mode == v1::LOAD_MODE_PIPELINED);
          ++remote_loads;
        }
      }
    }
    EXPECT_TRUE(WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(10000)).ok());
    EXPECT_TRUE(WaitForAllBlocksFree(prefill_address(), false, DeadlineAfterMs(10000)).ok());
    auto dstats = CallStats(*stub_);
    ASSERT_TRUE(dstats.ok()) << dstats.status().ToString();
    EXPECT_EQ(dstats->transport(), transport());
    EXPECT_EQ(dstats->backend(), "cuda:" + std::to_string(GetParam().decode_device));
    EXPECT_EQ(dstats->counters().requests_failed(), 0u);
    EXPECT_EQ(dstats->counters().loads_recomputed(), 0u);
    EXPECT_GT(dstats->counters().kv_bytes_moved(), 0u);
    pstats = CallStats(*pstub);
    ASSERT_TRUE(pstats.ok());
    EXPECT_EQ(pstats->counters().requests_ok(), uint64_t(remote_loads));
    EXPECT_EQ(pstats->counters().requests_failed(), 0u);
  }
};

// gpu_landed_wait (cuda_ipc only): the prefill notifies each layer as soon as its copy is
// enqueued and the decode's compute stream waits for the prefill's landed flag on the GPU;
// tokens must still equal the colocated ones, and the decode must have granted the flag (so
// the early path really ran).
TEST_P(DaemonsGpuTest, GpuLandedWaitTokensEqualColocated) {
  if (::testing::PrintToString(GetParam()).find("cuda_ipc") == std::string::npos)
    GTEST_SKIP() << "gpu_landed_wait is a cuda_ipc option";
  RunCase({"--model=tiny", "--pool_blocks=64"}, {}, {"--gpu_landed_wait=true"}, 512,
          {2, 17, 100, 300}, 8);
  EXPECT_NE(decode_->Log().find("landed flag slot"), std::string::npos) << decode_->Log();
}

TEST_P(DaemonsGpuTest, TinyTokensEqualColocatedOnGpu) {
  RunCase({"--model=tiny", "--pool_blocks=64"}, {}, {"--log_level=info"}, 512, {1, 2, 17, 100, 300},
          8);
  // The handshake compares the daemons' GPU identities: on one GPU the decode says so (and
  // first_step_after_load=auto then waits for the whole load before the first step instead of
  // time-slicing with the prefill); on two it must not.
  const bool same = GetParam().prefill_device == GetParam().decode_device;
  EXPECT_EQ(decode_->Log().find("prefill computes on this GPU") != std::string::npos, same)
      << decode_->Log();
}

// The pinned host tier below the prefill's GPU pool (kvcache/cuda/pinned_tier.h), without the
// pool's prefix cache: a prompt computed once is written down; again, it comes whole from the tier
// (no forward); a longer prompt over it computes only its suffix while the prefix is fetched
// layer by layer. Tokens equal the colocated ones; every pool block comes back.
TEST_P(DaemonsGpuTest, PinnedHostTierTokensEqualColocated) {
  if (GetParam().transport != "cuda_ipc" || GetParam().prefill_device != GetParam().decode_device)
    GTEST_SKIP() << "the tier is the prefill's own: one case (cuda_ipc, one GPU) is enough";
  ASSERT_NO_FATAL_FAILURE(StartDaemonsTogether(
      Pair({"--model=tiny", "--pool_blocks=64"},
           {"--kv_host_tier_mb=16", "--prompt_cache_blocks=0", "--kv_prefetch_threshold_tokens=0"}, {})));
  std::vector<int32_t> base = MakePrompt(200, 512, 5), longer = base;
  for (int32_t t : MakePrompt(60, 512, 6)) longer.push_back(t);
  for (const auto* prompt : {&base, &base, &longer, &longer}) {
    auto local = CallGenerate(*stub_, *prompt, 8, v1::LOAD_MODE_LOCAL, 120000);
    ASSERT_TRUE(local.status.ok()) << local.status.error_message();
    auto r = CallGenerate(*stub_, *prompt, 8, v1::LOAD_MODE_PIPELINED, 120000);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, local.tokens) << "prompt of " << prompt->size();
    // The write-down holds its pool blocks until its copy is complete (and visible).
    ASSERT_TRUE(WaitForAllBlocksFree(prefill_address(), false, DeadlineAfterMs(10000)).ok());
  }
  auto pstub = PrefillStub(prefill_address());
  auto st = CallStats(*pstub);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_GE(st->kv_tiers_size(), 1);
  EXPECT_EQ(st->kv_tiers(0).name(), "host");
  // The prefill gets a prompt less its last token (the decode's first step computes it): base
  // whole (199), longer's prefix (192 = 12 full blocks), longer whole (259).
  EXPECT_EQ(st->kv_tier_fetched_tokens(), 199u + 192u + 259u);
  EXPECT_EQ(st->counters().requests_failed(), 0u);
  EXPECT_TRUE(WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(10000)).ok());
}

// A disk tier below the pinned tier (staged through it): a prompt computed once reaches the disk
// from the pinned copy; both daemons restarted on the same directory (the pinned tier empty),
// the prompt and a longer one are served from disk through the pinned tier, layer by layer.
// Tokens equal the colocated ones; every pool block comes back.
TEST_P(DaemonsGpuTest, DiskBelowPinnedTierTokensEqualColocated) {
  if (GetParam().transport != "cuda_ipc" || GetParam().prefill_device != GetParam().decode_device)
    GTEST_SKIP() << "the tier is the prefill's own: one case (cuda_ipc, one GPU) is enough";
  const std::string secret = dir_.path() + "/kv.secret";
  std::ofstream(secret) << "0123456789abcdef0123456789abcdef\n";
  ::chmod(secret.c_str(), 0600);
  const DaemonPair pair = Pair({"--model=tiny", "--pool_blocks=64"},
                               {"--kv_host_tier_mb=16", "--prompt_cache_blocks=0",
                                "--kv_prefetch_threshold_tokens=0", "--kv_disk_tier_dir=" + dir_.path() + "/kv",
                                "--kv_tier_secret_file=" + secret},
                               {});
  ASSERT_NO_FATAL_FAILURE(StartDaemonsTogether(pair));
  std::vector<int32_t> base = MakePrompt(200, 512, 7), longer = base;
  for (int32_t t : MakePrompt(60, 512, 8)) longer.push_back(t);
  for (int round = 0; round < 2; ++round) {
    for (const auto* prompt : {&base, &longer}) {
      auto local = CallGenerate(*stub_, *prompt, 8, v1::LOAD_MODE_LOCAL, 120000);
      ASSERT_TRUE(local.status.ok()) << local.status.error_message();
      auto r = CallGenerate(*stub_, *prompt, 8, v1::LOAD_MODE_PIPELINED, 120000);
      ASSERT_TRUE(r.status.ok()) << r.status.error_message();
      EXPECT_EQ(r.tokens, local.tokens) << "round " << round << ", prompt of " << prompt->size();
      ASSERT_TRUE(WaitForAllBlocksFree(prefill_address(), false, DeadlineAfterMs(10000)).ok());
    }
    auto pstub = PrefillStub(prefill_address());
    if (round == 1) {
      // base whole (199 tokens) and longer's prefix (192) from disk through the pinned tier.
      auto st = CallStats(*pstub);
      ASSERT_TRUE(st.ok()) << st.status().ToString();
      ASSERT_EQ(st->kv_tiers_size(), 2);
      EXPECT_EQ(st->kv_tiers(1).name(), "disk");
      EXPECT_EQ(st->kv_tiers(1).hit_blocks(), 13u);
      EXPECT_EQ(st->kv_tier_fetched_tokens(), 199u + 192u);
      EXPECT_EQ(st->counters().requests_failed(), 0u);
      break;
    }
    // The write to disk follows the pinned copy's: wait for base's 13 blocks and longer's 5.
    uint64_t written = 0;
    for (int i = 0; i < 200 && written < 18; ++i) {
      auto st = CallStats(*pstub);
      ASSERT_TRUE(st.ok()) << st.status().ToString();
      written = st->kv_tiers_size() > 1 ? st->kv_tiers(1).written_blocks() : 0;
      if (written < 18) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_GE(written, 18u);
    prefill_->Signal(SIGTERM);
    decode_->Signal(SIGTERM);
    EXPECT_EQ(prefill_->Wait(DeadlineAfterMs(15000)), 0);
    EXPECT_EQ(decode_->Wait(DeadlineAfterMs(15000)), 0);
    ASSERT_NO_FATAL_FAILURE(StartDaemonsTogether(pair));
    longer.resize(base.size() - 8);  // round 1: a prompt whose prefix is on disk
    for (int32_t t : MakePrompt(68, 512, 9)) longer.push_back(t);
  }
  EXPECT_TRUE(WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(10000)).ok());
}

// The decode's write-down from its GPU pool (docs/kv_tiers.md, "The decode's write-down"): staged
// through its own pinned host tier to a real redis-server. Turn 1 (40 tokens, a 30-token
// answer: the decode holds the KV of 69 tokens, 4 full blocks, the 3rd and 4th with answer
// tokens); both daemons restarted (every pinned tier empty); turn 2 (+ the answer + 10 tokens)
// finds the 4 blocks in the store, the previous answer's included, and its tokens equal the
// colocated ones. The restarted (cold) decode loads those 4 blocks from the store itself,
// through its pinned tier (kv_decode_loads_prefix), and the prefill writes only the 5th; a
// 65-token prompt all stored needs no prefill call. Every block comes back on both daemons. A
// decode with a GPU pool and the store but no kv_host_tier_mb refuses to start, naming it.
TEST_P(DaemonsGpuTest, DecodeWritesDownFromItsGpuPool) {
  if (GetParam().transport != "cuda_ipc" || GetParam().prefill_device != GetParam().decode_device)
    GTEST_SKIP() << "the write-down is the decode's own: one case (cuda_ipc, one GPU) is enough";
  if (!OnPath("redis-server")) GTEST_SKIP() << "redis-server is not on PATH";
  kvcache::testing::RedisServer redis;
  const std::string secret = dir_.path() + "/kv.secret";
  std::ofstream(secret) << "0123456789abcdef0123456789abcdef\n";
  ::chmod(secret.c_str(), 0600);
  const std::vector<std::string> store = {
      "--kv_tier_secret_file=" + secret, "--kv_store_redis=unix:" + redis.socket(),
      "--kv_store_auth_file=" + redis.AuthFile(redis.password()), "--kv_store_timeout_ms=500",
      "--kv_host_tier_mb=16"};
  std::vector<std::string> prefill = store;
  for (const char* f : {"--prompt_cache_blocks=0", "--kv_prefetch_threshold_tokens=0"})
    prefill.push_back(f);
  std::vector<std::string> decode = store;
  decode.push_back("--kv_prefetch_threshold_tokens=0");
  decode.push_back("--kv_decode_loads_prefix=true");  // auto: off over cuda_ipc
  const DaemonPair pair = Pair({"--model=tiny", "--pool_blocks=64"}, prefill, decode);
  {
    std::vector<std::string> args = {"--model=tiny", "--pool_blocks=64", "--backend=cuda",
                                     "--device=0", "--listen=127.0.0.1:0", "--peer=127.0.0.1:1"};
    for (size_t i = 0; i + 1 < store.size(); ++i) args.push_back(store[i]);  // no host tier
    DaemonProcess refused("refused", DecodeBin(), args, dir_.path());
    ASSERT_TRUE(refused.Spawn().ok());
    EXPECT_EQ(refused.Wait(DeadlineAfterMs(60000)), 2) << refused.Log();
    EXPECT_NE(refused.Log().find("kv_host_tier_mb"), std::string::npos) << refused.Log();
  }
  ASSERT_NO_FATAL_FAILURE(StartDaemonsTogether(pair));
  auto prompt = MakePrompt(40, 512, 97);
  auto r = CallGenerate(*stub_, prompt, 30, v1::LOAD_MODE_PIPELINED, 120000);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  auto local = CallGenerate(*stub_, prompt, 30, v1::LOAD_MODE_LOCAL, 120000);
  ASSERT_TRUE(local.status.ok()) << local.status.error_message();
  ASSERT_EQ(r.tokens, local.tokens);
  // The decode's write-down, asynchronous: GPU -> pinned -> store, at least the 2 blocks the
  // prefill did not write; then every decode block back.
  uint64_t written = 0;
  for (int i = 0; i < 200; ++i) {
    auto st = CallStats(*stub_);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    ASSERT_EQ(st->kv_tiers_size(), 2);
    EXPECT_EQ(st->kv_tiers(0).name(), "host");
    EXPECT_EQ(st->kv_tiers(1).name(), "store");
    written = st->kv_tiers(1).written_blocks();
    if (written >= 2 && st->kv_tier_queued_blocks() == 0 &&
        st->pool().free_blocks() == st->pool().num_blocks())
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(written, 2u);
  prefill_->Signal(SIGTERM);
  decode_->Signal(SIGTERM);
  EXPECT_EQ(prefill_->Wait(DeadlineAfterMs(15000)), 0);
  EXPECT_EQ(decode_->Wait(DeadlineAfterMs(15000)), 0);
  ASSERT_NO_FATAL_FAILURE(StartDaemonsTogether(pair));
  prompt.insert(prompt.end(), r.tokens.begin(), r.tokens.end());
  for (int32_t t : MakePrompt(10, 512, 98)) prompt.push_back(t);  // 80 tokens: 79 at the prefill
  auto r2 = CallGenerate(*stub_, prompt, 8, v1::LOAD_MODE_PIPELINED, 120000);
  ASSERT_TRUE(r2.status.ok()) << r2.status.error_message();
  auto local2 = CallGenerate(*stub_, prompt, 8, v1::LOAD_MODE_LOCAL, 120000);
  ASSERT_TRUE(local2.status.ok()) << local2.status.error_message();
  EXPECT_EQ(r2.tokens, local2.tokens);
  v1::LoadInfo load;
  for (const auto& m : r2.messages)
    if (m.has_load()) load = m.load();
  EXPECT_EQ(load.decode_tier_tokens(), 64);  // the decode's 4 blocks, through its pinned tier
  EXPECT_TRUE(load.loaded_remotely());
  const std::vector<int32_t> stored(prompt.begin(), prompt.begin() + 65);
  auto r3 = CallGenerate(*stub_, stored, 8, v1::LOAD_MODE_PIPELINED, 120000);
  ASSERT_TRUE(r3.status.ok()) << r3.status.error_message();
  auto local3 = CallGenerate(*stub_, stored, 8, v1::LOAD_MODE_LOCAL, 120000);
  ASSERT_TRUE(local3.status.ok()) << local3.status.error_message();
  EXPECT_EQ(r3.tokens, local3.tokens);
  ASSERT_FALSE(r3.messages.empty());
  EXPECT_FALSE(r3.messages.front().load().loaded_remotely());  // no prefill call
  EXPECT_EQ(r3.messages.front().load().decode_tier_tokens(), 64);
  {
    auto dst = CallStats(*stub_);
    ASSERT_TRUE(dst.ok()) << dst.status().ToString();
    EXPECT_EQ(dst->kv_tier_fetched_tokens(), 128u);
  }
  ASSERT_TRUE(WaitForAllBlocksFree(prefill_address(), false, DeadlineAfterMs(10000)).ok());
  auto pstub = PrefillStub(prefill_address());
  auto st = CallStats(*pstub);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_EQ(st->kv_tiers_size(), 2);
  EXPECT_EQ(st->kv_tiers(1).name(), "store");
  EXPECT_EQ(st->kv_tiers(1).hit_blocks(), 4u);  // the 3rd and 4th hold the previous answer
  EXPECT_EQ(st->kv_tiers(1).read_failures(), 0u);
  EXPECT_EQ(st->kv_tier_fetched_tokens(), 64u);
  EXPECT_TRUE(WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(10000)).ok());
}

// Llama-3-8B's shapes (GQA 32/8, head 128, vocab 128256) cut to 2 layers; the decode pool is
// sized from free device memory (pool_gpu_fraction).
TEST_P(DaemonsGpuTest, Llama3ShapedTwoLayersEqualsColocatedOnGpu) {
  RunCase({"--model=llama-3-8b", "--layers=2"}, {"--pool_blocks=128"},
          {"--pool_gpu_fraction=0.02"}, 128256, {1, 37, 600, 1500}, 4);
  if (HasFailure()) return;
  auto dstats = CallStats(*stub_);
  ASSERT_TRUE(dstats.ok());
  // 2% of an H200's free memory is thousands of 2-layer blocks, far above the default 256.
  EXPECT_GT(dstats->pool().num_blocks(), 256) << "pool_gpu_fraction did not size the pool";
}

// The prefill SIGKILLed after its first layer was written, with later layers still to come
// (the GPU version of daemons_fault_test's PrefillKilledMidRequest...): the decode's request
// fails with "did not land" well inside its deadline, every decode block comes back, and a
// prefill restarted on the same address serves again (the decode's transport accepts a new
// writer after losing one; for nccl: a fresh communicator after the old one was aborted).
TEST_P(DaemonsGpuTest, PrefillKilledMidLoadFailsClearlyThenServesAgain) {
  const std::vector<std::string> model = {"--model=tiny", "--pool_blocks=64"};  // 2 layers
  DaemonPair pair = Pair(model, {"--fault_layer_delay_ms=300"}, {});
  pair.prefill_port = PickFreePort();  // the restarted prefill comes back on the same port
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  auto prompt = MakePrompt(40, 512, 3);
  auto reference = CallGenerate(*stub_, prompt, 4, v1::LOAD_MODE_LOCAL, 60000);
  ASSERT_TRUE(reference.status.ok()) << reference.status.error_message();

  const int kDeadlineMs = 20000;
  auto start = Clock::now();
  auto fut = std::async(std::launch::async, [&] {
    auto stub = DecodeStub(decode_address());
    return CallGenerate(*stub, prompt, 4, v1::LOAD_MODE_PIPELINED, kDeadlineMs);
  });
  {
    auto pstub = PrefillStub(prefill_address());
    const Deadline busy_deadline = DeadlineAfterMs(15000);
    bool busy = false;
    while (!busy && Clock::now() < busy_deadline) {
      auto st = CallStats(*pstub, 1000);
      busy = st.ok() && st->requests_in_flight() > 0;
      if (!busy) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(busy) << "the prefill never got the request";
  }
  // Layer 0 is written ~300 ms into the forward, layer 1 ~600 ms: kill in between.
  std::this_thread::sleep_for(std::chrono::milliseconds(450));
  prefill_->Signal(SIGKILL);
  EXPECT_EQ(prefill_->Wait(DeadlineAfterMs(5000)), 128 + SIGKILL);
  GenerateResult r = fut.get();
  const double elapsed = SecondsSince(start);
  EXPECT_FALSE(r.status.ok());
  EXPECT_LT(elapsed, 10.0) << "the failure took too long to surface";
  EXPECT_NE(r.status.error_message().find("did not land"), std::string::npos)
      << r.status.error_message();
  EXPECT_TRUE(r.tokens.empty());
  Status freed = WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(10000));
  EXPECT_TRUE(freed.ok()) << freed.ToString();

  // A new prefill on the same address: the decode handshakes again and serves.
  pair_.prefill = {"--device=" + std::to_string(GetParam().prefill_device)};
  ASSERT_NO_FATAL_FAILURE(StartPrefill());
  GenerateResult ok = CallGenerate(*stub_, prompt, 4, v1::LOAD_MODE_PIPELINED, 60000);
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.tokens, reference.tokens);
  ASSERT_FALSE(ok.messages.empty());
  EXPECT_TRUE(ok.messages.front().load().loaded_remotely());
  auto stats = CallStats(*stub_);
  ASSERT_TRUE(stats.ok());
  EXPECT_GE(stats->counters().handshakes(), 2u);
  EXPECT_EQ(stats->transport(), transport());
  freed = WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(10000));
  EXPECT_TRUE(freed.ok()) << freed.ToString();
}

std::string CaseName(const ::testing::TestParamInfo<GpuCase>& p) { return p.param.transport; }

// nccl is not here: NCCL refuses two ranks on one GPU (the transport says so at Connect).
INSTANTIATE_TEST_SUITE_P(OneGpu, DaemonsGpuTest,
                         ::testing::Values(GpuCase{"cuda_ipc", 0, 0}, GpuCase{"ucx_staged", 0, 0},
                                           GpuCase{"ucx", 0, 0}),
                         CaseName);
INSTANTIATE_TEST_SUITE_P(TwoGpus, DaemonsGpuTest,
                         ::testing::Values(GpuCase{"nccl", 0, 1}, GpuCase{"cuda_ipc", 0, 1},
                                           GpuCase{"ucx_staged", 0, 1}, GpuCase{"ucx", 0, 1}),
                         CaseName);

}  // namespace
}  // namespace kvstream::testing

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf("SKIPPED: no usable GPU (%s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 CUDA devices");
    return 77;
  }
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) continue;
    std::printf("GPU %d: %s, sm_%d%d\n", d, prop.name, prop.major, prop.minor);
    if (prop.major < 8) {
      std::printf("SKIPPED: the kernels are built for sm_80 and later\n");
      return 77;
    }
  }
  kvstream::testing::g_devices = count;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
