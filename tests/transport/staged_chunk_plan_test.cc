// The host-staged transport's chunk size per write (transport/staged/chunk_plan.h), on the CPU:
// a lone layer gets small chunks (its pipeline fill is most of its time), a write behind a long
// queue or a whole prompt gets the configured chunk size, and the bounds hold.
#include "transport/staged/chunk_plan.h"

#include <gtest/gtest.h>

namespace kvstream::transport::staged {
namespace {

constexpr uint64_t kMiB = 1 << 20, kKiB = 1 << 10;

TEST(StagedChunkPlan, LoneLayersGetSmallChunks) {
  // sqrt(16 MiB * 256 KiB) = 2 MiB; sqrt(64 MiB * 256 KiB) = 4 MiB.
  EXPECT_EQ(AdaptiveChunkBytes(0, 16 * kMiB, 256 * kKiB, 8 * kMiB), 2 * kMiB);
  EXPECT_EQ(AdaptiveChunkBytes(0, 64 * kMiB, 256 * kKiB, 8 * kMiB), 4 * kMiB);
}

TEST(StagedChunkPlan, QueuedBytesAndLargeWritesGetTheCap) {
  EXPECT_EQ(AdaptiveChunkBytes(0, 512 * kMiB, 256 * kKiB, 8 * kMiB), 8 * kMiB);
  // The same 16 MiB layer posted behind 240 MiB not yet started: its fill is hidden.
  EXPECT_EQ(AdaptiveChunkBytes(240 * kMiB, 16 * kMiB, 256 * kKiB, 8 * kMiB), 8 * kMiB);
  // Behind 48 MiB: sqrt(64 MiB * 256 KiB) = 4 MiB.
  EXPECT_EQ(AdaptiveChunkBytes(48 * kMiB, 16 * kMiB, 256 * kKiB, 8 * kMiB), 4 * kMiB);
}

TEST(StagedChunkPlan, Bounds) {
  // Off: the cap, whatever the size.
  EXPECT_EQ(AdaptiveChunkBytes(0, 16 * kMiB, 0, 8 * kMiB), 8 * kMiB);
  // Never below 1 MiB (per-chunk overhead), never above the cap, 64 KiB aligned.
  EXPECT_EQ(AdaptiveChunkBytes(0, 4096, 256 * kKiB, 8 * kMiB), 1 * kMiB);
  EXPECT_EQ(AdaptiveChunkBytes(0, 4096, 256 * kKiB, 512 * kKiB), 512 * kKiB);
  const uint64_t c = AdaptiveChunkBytes(0, 20 * kMiB, 256 * kKiB, 8 * kMiB);
  EXPECT_EQ(c % (64 * kKiB), 0u);
  EXPECT_GE(c * c, uint64_t(20 * kMiB) * (256 * kKiB));
  EXPECT_LT((c - 64 * kKiB) * (c - 64 * kKiB), uint64_t(20 * kMiB) * (256 * kKiB));  // rounded up by < 64 KiB
  // No overflow at the extremes.
  EXPECT_EQ(AdaptiveChunkBytes(~0ull / 2, ~0ull / 2, ~0ull, 8 * kMiB), 8 * kMiB);
}

}  // namespace
}  // namespace kvstream::transport::staged
