// The parameter-table scatter-copy kernel on the GPU, in one process: every launch shape the
// transport can pick (threads x unroll, piece sizes, grid-stride grids), tables longer than one
// launch, host-split uneven runs, and one large contiguous run must land byte-exact, and must
// leave every byte outside the runs untouched.
//
// Without a usable GPU the binary prints why and exits 77 (CTest: skipped).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "transport/cuda_ipc/scatter_copy.h"

namespace kvstream::transport::cuda {
namespace {

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

class ParamScatterTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kSrcBytes = 32ull << 20, kDstBytes = 64ull << 20;
  void SetUp() override {
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaMalloc(&src_, kSrcBytes));
    CUDA_OK(cudaMalloc(&dst_, kDstBytes));
    CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    host_src_.resize(kSrcBytes);
    for (uint64_t i = 0; i < kSrcBytes; i += 4) {
      uint32_t v = static_cast<uint32_t>(i * 2654435761u) ^ 0x5bd1e995u;
      std::memcpy(&host_src_[i], &v, 4);
    }
    CUDA_OK(cudaMemcpy(src_, host_src_.data(), kSrcBytes, cudaMemcpyHostToDevice));
  }
  void TearDown() override {
    cudaStreamDestroy(stream_);
    cudaFree(src_);
    cudaFree(dst_);
  }

  // Copies `runs` (offsets into src_/dst_) with `cfg`, then compares the whole destination with
  // a host model (0xEE where no run writes).
  void CheckCopy(const std::vector<CopyRun>& rel, uint64_t split, const ParamKernelConfig& cfg,
                 const std::string& what) {
    std::vector<CopyRun> runs;
    for (const CopyRun& r : rel) {
      runs.push_back({reinterpret_cast<uint64_t>(src_) + r.src, reinterpret_cast<uint64_t>(dst_) + r.dst,
                      r.length});
    }
    PackedTable t;
    ASSERT_TRUE(PackRuns(runs.data(), runs.size(), split, &t)) << what;
    CUDA_OK(cudaMemsetAsync(dst_, 0xEE, kDstBytes, stream_));
    Status s = LaunchParamScatterCopy(t, cfg, stream_);
    ASSERT_TRUE(s.ok()) << what << ": " << s.ToString();
    CUDA_OK(cudaStreamSynchronize(stream_));
    std::vector<unsigned char> want(kDstBytes, 0xEE), got(kDstBytes);
    for (const CopyRun& r : rel) std::memcpy(&want[r.dst], &host_src_[r.src], r.length);
    CUDA_OK(cudaMemcpy(got.data(), dst_, kDstBytes, cudaMemcpyDeviceToHost));
    if (want != got) {
      size_t at = 0;
      while (want[at] == got[at]) ++at;
      FAIL() << what << ": first wrong byte at destination offset " << at;
    }
  }

  void* src_ = nullptr;
  void* dst_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::vector<unsigned char> host_src_;
};

// 256 blocks of 64 KiB to shuffled slots of a pool (a llama-3-8b layer), a few of them runs of
// two blocks (as coalescing makes them), under every launch shape.
TEST_F(ParamScatterTest, ScatteredBlocksLandExactlyUnderEveryLaunchShape) {
  constexpr uint64_t kBlock = 64 << 10;
  std::mt19937_64 rng(3);
  std::vector<uint64_t> slots(512);
  for (uint64_t i = 0; i < slots.size(); ++i) slots[i] = i;
  std::shuffle(slots.begin(), slots.end(), rng);
  std::vector<CopyRun> runs;
  for (uint64_t i = 0; i < 256; ++i) {
    // Even pool slots only, so a two-block run (into the odd slot after it) overlaps nothing.
    runs.push_back({i * 2 * kBlock, 2 * slots[i] * kBlock, i % 50 == 1 ? 2 * kBlock : kBlock});
  }
  for (int threads : {128, 256, 512}) {
    for (int unroll : {4, 8}) {
      for (uint64_t piece : {uint64_t(0), uint64_t(16) << 10, uint64_t(256) << 10}) {
        for (uint32_t ctas : {0u, 7u}) {
          ParamKernelConfig cfg{threads, unroll, piece, ctas};
          CheckCopy(runs, 0, cfg,
                    "t" + std::to_string(threads) + "u" + std::to_string(unroll) + " piece " +
                        std::to_string(piece) + " ctas " + std::to_string(ctas));
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// More runs than one launch carries, odd 16-byte multiples (partial batches and pieces), and
// one long run among short ones cut on the host.
TEST_F(ParamScatterTest, LongTablesOddLengthsAndHostSplitRuns) {
  std::mt19937_64 rng(9);
  std::vector<CopyRun> runs;
  uint64_t s = 0, d = 0;
  for (int i = 0; i < 1000; ++i) {  // three launches of up to kParamTableCapacity runs
    const uint64_t len = 16 * (1 + rng() % 700);
    d += 16 * (rng() % 64);
    runs.push_back({s, d, len});
    s += len + 16 * (rng() % 8);
    d += len;
  }
  ASSERT_LE(s, kSrcBytes);
  ASSERT_LE(d, kDstBytes);
  std::shuffle(runs.begin(), runs.end(), rng);
  CheckCopy(runs, 0, ParamKernelConfig{}, "1000 odd runs");
  CheckCopy(runs, 0, ParamKernelConfig{256, 4, 1024, 0}, "1000 odd runs, 1 KiB pieces");
  // One 24 MiB + 48 B run and small ones: split on the host into 256 KiB pieces.
  std::vector<CopyRun> uneven = {{0, 1 << 20, (24 << 20) + 48}, {(25 << 20), 40 << 20, 4096},
                                 {(26 << 20), 50 << 20, 160}};
  CheckCopy(uneven, 256 << 10, ParamKernelConfig{}, "split uneven runs");
  // Unsplit: k pieces per run from the mean, so the long run gets long pieces and the 160-byte
  // run fewer pieces than k (units past its end do nothing).
  CheckCopy(uneven, 0, ParamKernelConfig{}, "uneven runs, k pieces each");
  CheckCopy(uneven, 0, ParamKernelConfig{512, 8, 0, 132}, "uneven runs, grid-stride");
}

TEST_F(ParamScatterTest, OneLargeContiguousRun) {
  CheckCopy({{0, 0, kSrcBytes}}, 0, ParamKernelConfig{}, "32 MiB contiguous");
  CheckCopy({{16, 32, kSrcBytes - 16}}, 0, ParamKernelConfig{512, 4, 0, 0}, "offset by 16/32");
}

TEST_F(ParamScatterTest, RefusesBadConfigsWithoutLaunching) {
  std::vector<CopyRun> runs = {{reinterpret_cast<uint64_t>(src_), reinterpret_cast<uint64_t>(dst_), 4096}};
  PackedTable t;
  ASSERT_TRUE(PackRuns(runs.data(), runs.size(), 0, &t));
  EXPECT_EQ(LaunchParamScatterCopy(t, ParamKernelConfig{300, 4, 0, 0}, stream_).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(LaunchParamScatterCopy(t, ParamKernelConfig{256, 4, 100, 0}, stream_).code(),
            StatusCode::kInvalidArgument);
  CUDA_OK(cudaStreamSynchronize(stream_));
  CUDA_OK(cudaGetLastError());
}

}  // namespace
}  // namespace kvstream::transport::cuda

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (::testing::GTEST_FLAG(list_tests)) return RUN_ALL_TESTS();
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("SKIP scatter_copy_gpu_test: no usable CUDA device (%s)\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount returned 0");
    return 77;
  }
  return RUN_ALL_TESTS();
}
