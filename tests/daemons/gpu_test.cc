// GPU integration (label gpu): the real kvstream-prefill and kvstream-decode processes on one
// GPU, CUDA backend, KV pools in device memory, for each GPU transport built in (cuda_ipc,
// ucx_staged). Disaggregated tokens (pipelined and not) must equal the decode daemon computing
// the prompt itself on the same GPU (LOAD_MODE_LOCAL, the colocated path), every block must be
// back afterwards, and both daemons must report the transport asked for. Exits 77 (skipped)
// with the reason when no usable GPU is present.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>

#include "tests/daemons/disagg_fixture.h"
#include "transport/transport.h"

namespace kvstream::testing {
namespace {

namespace v1 = kvstream::v1;

class DaemonsGpuTest : public DisaggTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    auto built = transport::AvailableBackends();
    if (std::find(built.begin(), built.end(), GetParam()) == built.end())
      GTEST_SKIP() << "transport " << GetParam() << " is not built in";
  }

  // Starts the pair on GPU 0 with `model` flags, then checks every prompt length: LOCAL first
  // (the reference), then pipelined and non-pipelined loads.
  void RunCase(const std::vector<std::string>& model, const std::vector<std::string>& prefill_extra,
               const std::vector<std::string>& decode_extra, int vocab,
               const std::vector<int>& prompt_lens, int max_tokens) {
    DaemonPair pair;
    pair.common = model;
    for (const char* f : {"--backend=cuda", "--device=0"}) pair.common.push_back(f);
    pair.common.push_back("--transport=" + GetParam());
    pair.prefill = prefill_extra;
    pair.decode = decode_extra;
    ASSERT_NO_FATAL_FAILURE(StartDaemonsTogether(pair));

    auto pstub = PrefillStub(prefill_address());
    auto pstats = CallStats(*pstub, 120000);
    ASSERT_TRUE(pstats.ok()) << pstats.status().ToString();
    EXPECT_EQ(pstats->transport(), GetParam());
    EXPECT_EQ(pstats->backend().rfind("cuda", 0), 0u) << pstats->backend();

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
    EXPECT_EQ(dstats->transport(), GetParam());
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
  RunCase({"--model=tiny", "--pool_blocks=64"}, {}, {}, 512, {1, 2, 17, 100, 300}, 8);
  // Both daemons compute on GPU 0: the handshake shows it (first_step_after_load=auto then
  // waits for the whole load before the first step instead of time-slicing with the prefill).
  EXPECT_NE(decode_->Log().find("prefill computes on this GPU"), std::string::npos)
      << decode_->Log();
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

INSTANTIATE_TEST_SUITE_P(GpuTransports, DaemonsGpuTest,
                         ::testing::Values(std::string("cuda_ipc"), std::string("ucx_staged")),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

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
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    std::printf("GPU 0: %s, sm_%d%d\n", prop.name, prop.major, prop.minor);
    if (prop.major != 9) {
      std::printf("SKIPPED: the kernels are built for sm_90a only\n");
      return 77;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
