// Argument checks of the paged decode launcher: every unsupported shape is refused with
// cudaErrorInvalidValue before anything touches the device, so this runs without a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/paged_attention.h"
#include "kernels/paged_attention_timeline.h"

namespace kvstream::kernels {
namespace {

// Fake, 16-byte-aligned addresses: never dereferenced, since every case below is refused.
alignas(16) char fake[64];

PagedDecodeParams Valid() {
  PagedDecodeParams p;
  p.out = fake;
  p.q = fake;
  p.kv_layer = fake;
  p.block_tables = reinterpret_cast<const int32_t*>(fake);
  p.context_lens = reinterpret_cast<const int32_t*>(fake);
  p.num_seqs = 2;
  p.num_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim = 128;
  p.block_size = 16;
  p.max_blocks_per_seq = 4;
  p.max_context_len = 64;
  p.scale = 0.088f;
  return p;
}

TEST(PagedDecodeArgs, ValidShapesAreSupported) {
  for (DType dt : {DType::kF16, DType::kBF16})
    for (int d : {64, 128, 256})
      for (int bs : {16, 32}) {
        PagedDecodeParams p = Valid();
        p.dtype = dt;
        p.head_dim = d;
        p.block_size = bs;
        EXPECT_TRUE(PagedDecodeSupported(p)) << d << " " << bs;
        for (Schedule sc : {Schedule::kAuto, Schedule::kV2, Schedule::kKernel, Schedule::kFused,
                            Schedule::kWideKernel, Schedule::kWideFused, Schedule::kCluster,
                            Schedule::kWideCluster}) {
          p.schedule = sc;
          EXPECT_TRUE(PagedDecodeSupported(p)) << d << " " << bs << " schedule " << int(sc);
          EXPECT_TRUE(PagedDecodeDescribe(p).supported) << d << " " << bs << " schedule " << int(sc);
        }
      }
}

TEST(PagedDecodeArgs, UnsupportedShapesAreRefused) {
  auto refused = [](auto mutate, const char* what) {
    PagedDecodeParams p = Valid();
    mutate(p);
    EXPECT_FALSE(PagedDecodeSupported(p)) << what;
    EXPECT_EQ(PagedDecodeAttention(p, nullptr), cudaErrorInvalidValue) << what;
    EXPECT_EQ(PagedDecodeWorkspaceBytes(p), 0u) << what;
    EXPECT_EQ(PagedDecodeNumSplits(p), 0) << what;
    EXPECT_FALSE(PagedDecodeDescribe(p).supported) << what;
  };
  refused([](auto& p) { p.dtype = DType::kF32; }, "f32");
  refused([](auto& p) { p.head_dim = 96; }, "head 96");
  refused([](auto& p) { p.block_size = 8; }, "block 8");
  refused([](auto& p) { p.block_size = 64; }, "block 64");
  refused([](auto& p) { p.num_heads = 30; }, "heads not a multiple of kv heads");
  refused([](auto& p) { p.num_kv_heads = 0; }, "no kv heads");
  refused([](auto& p) { p.num_seqs = -1; }, "negative seqs");
  refused([](auto& p) { p.max_context_len = 65; }, "context past the block table");
  refused([](auto& p) { p.max_blocks_per_seq = 0; }, "empty block table");
  refused([](auto& p) { p.scale = NAN; }, "NaN scale");
  refused([](auto& p) { p.num_splits = -2; }, "negative splits");
  refused([](auto& p) { p.prefetch = static_cast<Prefetch>(7); }, "bad prefetch");
  refused([](auto& p) { p.prefetch_distance = 99; }, "prefetch distance");
  refused([](auto& p) { p.schedule = static_cast<Schedule>(7); }, "bad schedule");
  refused([](auto& p) { p.schedule = static_cast<Schedule>(-2); }, "bad schedule (negative)");
  refused([](auto& p) { p.early_prefetch_units = 5; }, "early prefetch over 4 units");
  refused([](auto& p) { p.combine_dims = 64; }, "combine slice other than 32 or 128");
  refused([](auto& p) { p.q = nullptr; }, "null q");
  refused([](auto& p) { p.context_lens = nullptr; }, "null lens");
  refused([](auto& p) { p.kv_layer = fake + 2; }, "misaligned kv");
}

// The per-CTA timestamps exist only in the instrumented build (bench/decode_timeline); the
// library everything else links has none and says so without touching the device.
TEST(PagedDecodeArgs, TimelineIsOnlyInTheInstrumentedBuild) {
  unsigned long long* any = reinterpret_cast<unsigned long long*>(fake);
  EXPECT_EQ(timeline::SetBuffer(any), cudaErrorNotSupported);
  EXPECT_EQ(timeline::SetBuffer(nullptr), cudaErrorNotSupported);
}

}  // namespace
}  // namespace kvstream::kernels
