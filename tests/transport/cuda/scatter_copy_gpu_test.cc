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

#include "transport/cuda/copy_plan.h"

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

// The block-table kernel: (source unit, destination unit) pairs of one unit size. Same host
// model as CheckCopy: every destination byte outside the units must keep 0xEE.
void CheckBlocks(void* src, void* dst, uint64_t dst_bytes,
                 const std::vector<unsigned char>& host_src, uint64_t unit,
                 const std::vector<BlockEntry>& e, const ParamKernelConfig& cfg,
                 cudaStream_t stream, const std::string& what) {
  CUDA_OK(cudaMemsetAsync(dst, 0xEE, dst_bytes, stream));
  Status s = LaunchBlockScatterCopy(reinterpret_cast<uint64_t>(src), reinterpret_cast<uint64_t>(dst),
                                    unit, e.data(), e.size(), cfg, stream);
  ASSERT_TRUE(s.ok()) << what << ": " << s.ToString();
  CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<unsigned char> want(dst_bytes, 0xEE), got(dst_bytes);
  for (const BlockEntry& x : e) {
    std::memcpy(&want[uint64_t(x.dst) * unit], &host_src[uint64_t(x.src) * unit], unit);
  }
  CUDA_OK(cudaMemcpy(got.data(), dst, dst_bytes, cudaMemcpyDeviceToHost));
  if (want != got) {
    size_t at = 0;
    while (want[at] == got[at]) ++at;
    FAIL() << what << ": first wrong byte at destination offset " << at << " (unit "
           << at / unit << ")";
  }
}

std::vector<BlockEntry> ShuffledUnits(size_t n, uint64_t src_units, uint64_t dst_units,
                                      uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> s(src_units), d(dst_units);
  for (uint32_t i = 0; i < src_units; ++i) s[i] = i;
  for (uint32_t i = 0; i < dst_units; ++i) d[i] = i;
  std::shuffle(s.begin(), s.end(), rng);
  std::shuffle(d.begin(), d.end(), rng);
  std::vector<BlockEntry> e(n);
  for (size_t i = 0; i < n; ++i) e[i] = {s[i % src_units], d[i]};
  return e;
}

// 256 units of 64 KiB (a llama-3-8b layer at 4k tokens: one small parameter block) under every
// launch shape, and 1024 (16k tokens: one launch with 8 KiB of parameters on CUDA >= 12.1).
TEST_F(ParamScatterTest, BlockTableUnitsLandExactlyUnderEveryLaunchShape) {
  constexpr uint64_t kUnit = 64 << 10;
  auto e = ShuffledUnits(256, kSrcBytes / kUnit, kDstBytes / kUnit, 11);
  for (int threads : {128, 256, 512}) {
    for (int unroll : {4, 8}) {
      for (uint64_t piece : {uint64_t(0), uint64_t(16) << 10, uint64_t(48) << 10}) {
        for (uint32_t ctas : {0u, 7u}) {
          ParamKernelConfig cfg{threads, unroll, piece, ctas};
          CheckBlocks(src_, dst_, kDstBytes, host_src_, kUnit, e, cfg, stream_,
                      "t" + std::to_string(threads) + "u" + std::to_string(unroll) + " piece " +
                          std::to_string(piece) + " ctas " + std::to_string(ctas));
          if (HasFatalFailure()) return;
        }
      }
    }
  }
  auto e1024 = ShuffledUnits(1024, kSrcBytes / (16 << 10), kDstBytes / (16 << 10), 12);
  CheckBlocks(src_, dst_, kDstBytes, host_src_, 16 << 10, e1024, ParamKernelConfig{},
              stream_, "1024 units of 16 KiB");
}

// Every parameter-block size (508 / 1020 / 2044 / 4088 entries) and more units than one launch
// holds (several launches), an odd unit size (a shorter last piece), a unit of 16 bytes.
TEST_F(ParamScatterTest, BlockTableEveryParameterSizeAndSeveralLaunches) {
  std::printf("block-table launch capacity here: %zu entries\n", BlockTableLaunchCapacity());
  for (size_t n : {size_t(1), size_t(508), size_t(509), size_t(1020), size_t(2044), size_t(4088),
                   size_t(4089), size_t(9000)}) {
    constexpr uint64_t kUnit = 4096;
    auto e = ShuffledUnits(n, kSrcBytes / kUnit, kDstBytes / kUnit, 100 + n);
    CheckBlocks(src_, dst_, kDstBytes, host_src_, kUnit, e, ParamKernelConfig{}, stream_,
                std::to_string(n) + " units of 4 KiB");
    if (HasFatalFailure()) return;
  }
  // 144 B units in 5 pieces of 32 B (the last 16 B); 16 B units.
  auto e = ShuffledUnits(3000, kSrcBytes / 144, kDstBytes / 144, 5);
  CheckBlocks(src_, dst_, kDstBytes, host_src_, 144, e, ParamKernelConfig{256, 4, 32, 0},
              stream_, "144 B units, 32 B pieces");
  e = ShuffledUnits(2000, 1 << 16, 1 << 16, 6);
  CheckBlocks(src_, dst_, kDstBytes, host_src_, 16, e, ParamKernelConfig{}, stream_,
              "16 B units");
}

TEST_F(ParamScatterTest, BlockTableRefusesBadArgumentsWithoutLaunching) {
  std::vector<BlockEntry> e = {{0, 0}};
  const uint64_t s = reinterpret_cast<uint64_t>(src_), d = reinterpret_cast<uint64_t>(dst_);
  EXPECT_EQ(LaunchBlockScatterCopy(s, d, 4096, e.data(), 1, ParamKernelConfig{300, 4, 0, 0}, stream_).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(LaunchBlockScatterCopy(s + 8, d, 4096, e.data(), 1, ParamKernelConfig{}, stream_).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(LaunchBlockScatterCopy(s, d, 4100, e.data(), 1, ParamKernelConfig{}, stream_).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(LaunchBlockScatterCopy(s, d, 4096, e.data(), 1, ParamKernelConfig{256, 4, 100, 0}, stream_).code(),
            StatusCode::kInvalidArgument);
  CUDA_OK(cudaStreamSynchronize(stream_));
  CUDA_OK(cudaGetLastError());
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
