// Each kernel of kvstream_kernels_ops against a plain CPU computation on random data.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/dummy_init.h"
#include "kernels/kv_write.h"
#include "kernels/layer_ops.h"
#include "kernels/prefill_attention.h"
#include "tests/model/gpu_util.h"

namespace kvstream::kernels {
namespace {

using testing_gpu::DeviceVec;

// Host buffer of `n` elements of dtype from floats (rounded as the device would).
std::vector<uint16_t> ToHalfBits(const std::vector<float>& v, DType t) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    out[i] = t == DType::kF16 ? F32ToF16(v[i]) : F32ToBf16(v[i]);
  }
  return out;
}
float HalfBitsToF(uint16_t b, DType t) { return t == DType::kF16 ? F16ToF32(b) : Bf16ToF32(b); }
float Round(float v, DType t) {
  if (t == DType::kF32) return v;
  return HalfBitsToF(t == DType::kF16 ? F32ToF16(v) : F32ToBf16(v), t);
}

std::vector<float> RandomFloats(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

class DTypeTest : public ::testing::TestWithParam<DType> {};

TEST_P(DTypeTest, DummyFillIsBitIdenticalToHost) {
  const DType t = GetParam();
  const size_t n = 100003;
  const uint64_t seed = 7, id = 42, first = 5;
  const float scale = 0.3f, offset = 1.0f;
  DeviceVec<uint8_t> d(n * DTypeSize(t));
  ASSERT_CUDA(DummyFill(d.get(), t, n, seed, id, first, scale, offset, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<uint8_t> got = d.Download();
  std::vector<uint8_t> want(n * DTypeSize(t));
  for (size_t i = 0; i < n; ++i) {
    StoreFromF32(want.data(), t, i, offset + DummyValue(seed, id, first + i, scale));
  }
  ASSERT_EQ(0, std::memcmp(got.data(), want.data(), want.size()));
}

TEST_P(DTypeTest, ConvertRoundsToNearestEven) {
  const DType t = GetParam();
  std::vector<float> src = RandomFloats(5000, -70000.f, 70000.f, 1);
  std::vector<float> small = RandomFloats(5000, -1e-4f, 1e-4f, 2);  // f16 subnormals
  src.insert(src.end(), small.begin(), small.end());
  src.push_back(0.f);
  src.push_back(-0.f);
  src.push_back(std::numeric_limits<float>::infinity());
  src.push_back(65519.f);
  src.push_back(65520.f);
  DeviceVec<float> d_src(src);
  DeviceVec<uint8_t> d_dst(src.size() * DTypeSize(t));
  ASSERT_CUDA(Convert(d_dst.get(), t, d_src.get(), DType::kF32, src.size(), nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<uint8_t> got = d_dst.Download();
  std::vector<uint8_t> want(src.size() * DTypeSize(t));
  for (size_t i = 0; i < src.size(); ++i) StoreFromF32(want.data(), t, i, src[i]);
  ASSERT_EQ(0, std::memcmp(got.data(), want.data(), want.size()));

  // And back to f32: exact.
  DeviceVec<float> d_back(src.size());
  ASSERT_CUDA(Convert(d_back.get(), DType::kF32, d_dst.get(), t, src.size(), nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<float> back = d_back.Download();
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(LoadAsF32(want.data(), t, i), back[i]) << i;
  }
}

TEST_P(DTypeTest, EmbeddingGather) {
  const DType t = GetParam();
  const int vocab = 50, hidden = 96;
  std::vector<float> table = RandomFloats(size_t(vocab) * hidden, -1.f, 1.f, 3);
  std::vector<uint8_t> table_bytes(table.size() * DTypeSize(t));
  for (size_t i = 0; i < table.size(); ++i) StoreFromF32(table_bytes.data(), t, i, table[i]);
  std::vector<int32_t> tokens = {3, 0, 49, 3, -1, 50, 17};
  DeviceVec<uint8_t> d_table(table_bytes);
  DeviceVec<int32_t> d_tokens(tokens);
  DeviceVec<float> d_out(tokens.size() * hidden);
  ASSERT_CUDA(EmbeddingGather(d_out.get(), d_table.get(), t, d_tokens.get(), int(tokens.size()),
                              vocab, hidden, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<float> out = d_out.Download();
  for (size_t r = 0; r < tokens.size(); ++r) {
    for (int h = 0; h < hidden; ++h) {
      const bool in_range = tokens[r] >= 0 && tokens[r] < vocab;
      const float want =
          in_range ? LoadAsF32(table_bytes.data(), t, size_t(tokens[r]) * hidden + h) : 0.f;
      ASSERT_EQ(want, out[r * hidden + h]) << r << "," << h;
    }
  }
}

TEST_P(DTypeTest, RmsNorm) {
  const DType t = GetParam();
  for (int hidden : {100, 4096, 3584}) {
    const int rows = 5;
    const size_t stride = hidden + 13;
    std::vector<float> x = RandomFloats(rows * stride, -3.f, 3.f, 4 + hidden);
    std::vector<float> w = RandomFloats(hidden, 0.9f, 1.1f, 5);
    std::vector<uint8_t> w_bytes(hidden * DTypeSize(t));
    for (int i = 0; i < hidden; ++i) StoreFromF32(w_bytes.data(), t, i, w[i]);
    DeviceVec<float> d_x(x);
    DeviceVec<uint8_t> d_w(w_bytes);
    DeviceVec<uint8_t> d_out(size_t(rows) * hidden * DTypeSize(t));
    const float eps = 1e-5f;
    ASSERT_CUDA(RmsNorm(d_out.get(), t, d_x.get(), stride, d_w.get(), t, rows, hidden, eps,
                        nullptr));
    ASSERT_CUDA(cudaDeviceSynchronize());
    std::vector<uint8_t> out = d_out.Download();
    for (int r = 0; r < rows; ++r) {
      double ss = 0;
      for (int i = 0; i < hidden; ++i) ss += double(x[r * stride + i]) * x[r * stride + i];
      const double inv = 1.0 / std::sqrt(ss / hidden + eps);
      for (int i = 0; i < hidden; ++i) {
        const double want = x[r * stride + i] * inv * LoadAsF32(w_bytes.data(), t, i);
        const double got = LoadAsF32(out.data(), t, size_t(r) * hidden + i);
        const double tol = (t == DType::kF32 ? 1e-5 : (t == DType::kF16 ? 1e-3 : 8e-3)) *
                           (std::fabs(want) + 1e-3);
        ASSERT_NEAR(want, got, tol) << "hidden " << hidden << " row " << r << " i " << i;
      }
    }
  }
}

TEST_P(DTypeTest, SwiGlu) {
  const DType t = GetParam();
  const int tokens = 3, inter = 1000;
  std::vector<float> gu = RandomFloats(size_t(tokens) * 2 * inter, -6.f, 6.f, 6);
  DeviceVec<float> d_gu(gu);
  DeviceVec<uint8_t> d_out(size_t(tokens) * inter * DTypeSize(t));
  ASSERT_CUDA(SwiGlu(d_out.get(), t, d_gu.get(), tokens, inter, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<uint8_t> out = d_out.Download();
  for (int r = 0; r < tokens; ++r) {
    for (int j = 0; j < inter; ++j) {
      const double g = gu[size_t(r) * 2 * inter + j], u = gu[size_t(r) * 2 * inter + inter + j];
      const double want = g / (1 + std::exp(-g)) * u;
      const double got = LoadAsF32(out.data(), t, size_t(r) * inter + j);
      const double tol = (t == DType::kF32 ? 1e-5 : (t == DType::kF16 ? 1e-3 : 8e-3)) *
                         (std::fabs(want) + 1e-3);
      ASSERT_NEAR(want, got, tol) << r << "," << j;
    }
  }
}

TEST_P(DTypeTest, GatherRows) {
  const DType t = GetParam();
  const int src_rows = 9, cols = 70, stride = 100;
  std::vector<float> src = RandomFloats(size_t(src_rows) * stride, -2.f, 2.f, 7);
  std::vector<int32_t> rows = {8, 0, 3, 3};
  DeviceVec<float> d_src(src);
  DeviceVec<int32_t> d_rows(rows);
  DeviceVec<uint8_t> d_dst(rows.size() * cols * DTypeSize(t));
  ASSERT_CUDA(GatherRows(d_dst.get(), t, d_src.get(), DType::kF32, stride, d_rows.get(),
                         int(rows.size()), cols, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<uint8_t> out = d_dst.Download();
  for (size_t r = 0; r < rows.size(); ++r) {
    for (int c = 0; c < cols; ++c) {
      ASSERT_EQ(Round(src[size_t(rows[r]) * stride + c], t), LoadAsF32(out.data(), t, r * cols + c));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, DTypeTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(LayerOps, RotaryWithAndWithoutBias) {
  for (int hd : {64, 128}) {
    for (bool with_bias : {false, true}) {
      const int T = 7, nh = 4, nkv = 2;
      const float theta = hd == 64 ? 10000.f : 500000.f;
      const int width = (nh + 2 * nkv) * hd;
      std::vector<int32_t> pos = {0, 1, 2, 17, 999, 4095, 31000};
      std::vector<float> qkv = RandomFloats(size_t(T) * width, -2.f, 2.f, 8 + hd);
      std::vector<float> bias = RandomFloats(width, -0.1f, 0.1f, 9);
      std::vector<uint16_t> bias_bits = ToHalfBits(bias, DType::kBF16);
      DeviceVec<int32_t> d_pos(pos);
      DeviceVec<float> d_table(size_t(T) * hd);
      DeviceVec<float> d_qkv(qkv);
      DeviceVec<uint16_t> d_bias(bias_bits);
      std::vector<double> inv(hd / 2);
      for (int i = 0; i < hd / 2; ++i) inv[i] = std::pow(double(theta), -2.0 * i / hd);
      DeviceVec<double> d_inv(inv);
      ASSERT_CUDA(RopeTable(d_table.get(), d_pos.get(), nullptr, d_inv.get(), T, hd, 1.0, nullptr));
      ASSERT_CUDA(BiasRotary(d_qkv.get(), with_bias ? d_bias.get() : nullptr, DType::kBF16,
                             d_table.get(), T, nh, nkv, hd, nullptr));
      ASSERT_CUDA(cudaDeviceSynchronize());
      std::vector<float> got = d_qkv.Download();
      for (int t = 0; t < T; ++t) {
        std::vector<double> row(width);
        for (int c = 0; c < width; ++c) {
          row[c] = qkv[size_t(t) * width + c] +
                   (with_bias ? double(Bf16ToF32(bias_bits[c])) : 0.0);
        }
        for (int h = 0; h < nh + nkv; ++h) {
          for (int i = 0; i < hd / 2; ++i) {
            const double a = pos[t] * std::pow(double(theta), -2.0 * i / hd);
            const double x0 = row[h * hd + i], x1 = row[h * hd + i + hd / 2];
            const double y0 = x0 * std::cos(a) - x1 * std::sin(a);
            const double y1 = x1 * std::cos(a) + x0 * std::sin(a);
            ASSERT_NEAR(y0, got[size_t(t) * width + h * hd + i], 1e-5) << t << " " << h << " " << i;
            ASSERT_NEAR(y1, got[size_t(t) * width + h * hd + i + hd / 2], 1e-5);
          }
        }
        for (int c = (nh + nkv) * hd; c < width; ++c) {  // v: bias only
          ASSERT_NEAR(row[c], got[size_t(t) * width + c], 1e-6);
        }
      }
    }
  }
}

// Several frequency rows (dynamic NTK: one per sequence) and a cos/sin scale (yarn).
TEST(LayerOps, RopeTableRowsAndScale) {
  const int T = 5, hd = 32, half = hd / 2;
  std::vector<int32_t> pos = {0, 3, 40, 41, 7000}, rows = {0, 1, 1, 0, 1};
  std::vector<double> inv(2 * half);
  for (int i = 0; i < half; ++i) {
    inv[i] = std::pow(10000.0, -2.0 * i / hd);
    inv[half + i] = inv[i] / 3;
  }
  DeviceVec<int32_t> d_pos(pos), d_rows(rows);
  DeviceVec<double> d_inv(inv);
  DeviceVec<float> d_table(size_t(T) * hd);
  ASSERT_CUDA(RopeTable(d_table.get(), d_pos.get(), d_rows.get(), d_inv.get(), T, hd, 1.25,
                        nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<float> got = d_table.Download();
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < half; ++i) {
      const double a = double(pos[t]) * inv[size_t(rows[t]) * half + i];
      EXPECT_NEAR(got[(size_t(t) * half + i) * 2], std::cos(a) * 1.25, 1e-6) << t << " " << i;
      EXPECT_NEAR(got[(size_t(t) * half + i) * 2 + 1], std::sin(a) * 1.25, 1e-6) << t << " " << i;
    }
  }
}

TEST(LayerOps, ResidualAdd) {
  const size_t n = 70001;
  std::vector<float> x = RandomFloats(n, -1.f, 1.f, 10), y = RandomFloats(n, -1.f, 1.f, 11);
  DeviceVec<float> d_x(x), d_y(y);
  ASSERT_CUDA(ResidualAdd(d_x.get(), d_y.get(), n, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<float> got = d_x.Download();
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(x[i] + y[i], got[i]);
}

TEST(LayerOps, ArgmaxLowestIndexWinsTies) {
  const int vocab = 128256, rows = 5;
  std::vector<float> l = RandomFloats(size_t(rows) * vocab, -5.f, 5.f, 12);
  // row 0: a clear max late in the row; row 1: a tie, lowest index wins; row 2: NaNs never
  // win; row 3: all -inf -> 0; row 4: the max at index 0 and at the end.
  l[size_t(0) * vocab + 100000] = 9.f;
  l[size_t(1) * vocab + 777] = 9.f;
  l[size_t(1) * vocab + 77] = 9.f;
  l[size_t(1) * vocab + 99999] = 9.f;
  l[size_t(2) * vocab + 5] = std::numeric_limits<float>::quiet_NaN();
  l[size_t(2) * vocab + 6] = 8.f;
  for (int j = 0; j < vocab; ++j) l[size_t(3) * vocab + j] = -std::numeric_limits<float>::infinity();
  l[size_t(4) * vocab + 0] = 9.f;
  l[size_t(4) * vocab + vocab - 1] = 9.f;
  DeviceVec<float> d_l(l);
  DeviceVec<int32_t> d_out(rows);
  ASSERT_CUDA(ArgmaxRows(d_out.get(), d_l.get(), rows, vocab, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<int32_t> got = d_out.Download();
  for (int r = 0; r < rows; ++r) {
    int best = 0;
    float bv = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < vocab; ++j) {
      if (l[size_t(r) * vocab + j] > bv) {
        bv = l[size_t(r) * vocab + j];
        best = j;
      }
    }
    EXPECT_EQ(best, got[r]) << "row " << r;
  }
  EXPECT_EQ(100000, got[0]);
  EXPECT_EQ(77, got[1]);
  EXPECT_EQ(6, got[2]);
  EXPECT_EQ(0, got[3]);
  EXPECT_EQ(0, got[4]);
}

TEST(LayerOps, RejectsBadShapes) {
  EXPECT_EQ(cudaErrorInvalidValue, RmsNorm(nullptr, DType::kF16, nullptr, 10, nullptr,
                                           DType::kF16, 1, 20, 1e-5f, nullptr));
  double inv = 1.0;
  EXPECT_EQ(cudaErrorInvalidValue, RopeTable(nullptr, nullptr, nullptr, &inv, 1, 63, 1.0, nullptr));
  EXPECT_EQ(cudaErrorInvalidValue, RopeTable(nullptr, nullptr, nullptr, nullptr, 1, 64, 1.0, nullptr));
  EXPECT_EQ(cudaSuccess, SwiGlu(nullptr, DType::kF16, nullptr, 0, 10, nullptr));
  PrefillAttentionParams p;
  p.head_dim = 96;
  EXPECT_FALSE(PrefillAttentionSupported(p));
  EXPECT_EQ(cudaErrorInvalidValue, PrefillAttention(p, nullptr));
}

// ---- KV write and prefill attention over a paged pool ----

struct PagedCase {
  DType dtype;
  int head_dim;
  int block_size;
  int num_heads;
  int num_kv_heads;
};

std::string CaseName(const ::testing::TestParamInfo<PagedCase>& info) {
  const PagedCase& c = info.param;
  return std::string(DTypeName(c.dtype)) + "_d" + std::to_string(c.head_dim) + "_b" +
         std::to_string(c.block_size) + "_h" + std::to_string(c.num_heads) + "_kv" +
         std::to_string(c.num_kv_heads);
}

class PagedTest : public ::testing::TestWithParam<PagedCase> {};

TEST_P(PagedTest, KvWriteThroughSlotMapping) {
  const PagedCase c = GetParam();
  const int nkv = c.num_kv_heads, hd = c.head_dim, bs = c.block_size, nblocks = 9;
  const int T = 2 * bs + 3;
  const size_t stride = size_t(c.num_heads + 2 * nkv) * hd;
  std::vector<float> qkv = RandomFloats(T * stride, -2.f, 2.f, 13);
  std::mt19937 rng(14);
  std::vector<int32_t> free_slots(nblocks * bs);
  std::iota(free_slots.begin(), free_slots.end(), 0);
  std::shuffle(free_slots.begin(), free_slots.end(), rng);
  std::vector<int32_t> slots(free_slots.begin(), free_slots.begin() + T);
  slots[4] = -1;                 // skipped
  slots[5] = nblocks * bs + 3;  // past the pool: skipped
  const size_t tile = size_t(bs) * hd;
  const size_t pool_elems = size_t(nblocks) * 2 * nkv * tile;
  std::vector<float> init = RandomFloats(pool_elems, -1.f, 1.f, 15);
  std::vector<uint16_t> pool = ToHalfBits(init, c.dtype);
  DeviceVec<uint16_t> d_pool(pool);
  DeviceVec<float> d_qkv(qkv);
  DeviceVec<int32_t> d_slots(slots);
  KvWriteParams p;
  p.kv_layer = d_pool.get();
  p.k = d_qkv.get() + size_t(c.num_heads) * hd;
  p.v = p.k + size_t(nkv) * hd;
  p.src_row_stride = stride;
  p.slot_mapping = d_slots.get();
  p.num_tokens = T;
  p.num_kv_heads = nkv;
  p.head_dim = hd;
  p.block_size = bs;
  p.num_blocks = nblocks;
  p.dtype = c.dtype;
  ASSERT_CUDA(KvWrite(p, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<uint16_t> want = pool;
  for (int t = 0; t < T; ++t) {
    if (slots[t] < 0 || slots[t] >= nblocks * bs) continue;
    const int b = slots[t] / bs, s = slots[t] % bs;
    for (int h = 0; h < nkv; ++h) {
      for (int d = 0; d < hd; ++d) {
        const size_t k_idx = (size_t(b) * 2 * nkv + h) * tile + size_t(s) * hd + d;
        const size_t v_idx = k_idx + size_t(nkv) * tile;
        const float kf = qkv[t * stride + size_t(c.num_heads) * hd + h * hd + d];
        const float vf = qkv[t * stride + size_t(c.num_heads + nkv) * hd + h * hd + d];
        want[k_idx] = c.dtype == DType::kF16 ? F32ToF16(kf) : F32ToBf16(kf);
        want[v_idx] = c.dtype == DType::kF16 ? F32ToF16(vf) : F32ToBf16(vf);
      }
    }
  }
  std::vector<uint16_t> got = d_pool.Download();
  ASSERT_EQ(want, got);
}

TEST_P(PagedTest, PrefillAttentionMatchesSoftmaxFormula) {
  const PagedCase c = GetParam();
  const int nh = c.num_heads, nkv = c.num_kv_heads, hd = c.head_dim, bs = c.block_size;
  const int group = nh / nkv;
  // (start_pos, new tokens): fresh prompts, chunked continuations, single tokens, lengths that
  // are not multiples of the block size or of the key tile.
  const std::vector<std::pair<int, int>> seqs = {
      {0, 1}, {0, 37}, {5, 1}, {100, 19}, {33, 70}, {1000, 3}, {bs, bs}, {0, 2 * bs + 1}};
  const int S = int(seqs.size());
  int max_blocks = 0, T = 0, max_new = 0;
  for (auto [start, n] : seqs) {
    max_blocks = std::max(max_blocks, (start + n + bs - 1) / bs);
    T += n;
    max_new = std::max(max_new, n);
  }
  const int nblocks = S * max_blocks + 3;
  std::mt19937 rng(16 + hd + bs + nh);
  std::vector<int32_t> ids(nblocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> tables(size_t(S) * max_blocks, 0);
  for (int s = 0, next = 0; s < S; ++s) {
    const int need = (seqs[s].first + seqs[s].second + bs - 1) / bs;
    for (int b = 0; b < need; ++b) tables[size_t(s) * max_blocks + b] = ids[next++];
  }
  const size_t tile = size_t(bs) * hd;
  std::vector<float> pool_f = RandomFloats(size_t(nblocks) * 2 * nkv * tile, -1.f, 1.f, 17);
  std::vector<uint16_t> pool = ToHalfBits(pool_f, c.dtype);
  std::vector<float> q_f = RandomFloats(size_t(T) * nh * hd, -2.f, 2.f, 18);
  std::vector<uint16_t> q = ToHalfBits(q_f, c.dtype);
  std::vector<int32_t> q_start(S + 1), start_pos(S);
  for (int s = 0; s < S; ++s) {
    q_start[s + 1] = q_start[s] + seqs[s].second;
    start_pos[s] = seqs[s].first;
  }
  DeviceVec<uint16_t> d_pool(pool), d_q(q), d_out(size_t(T) * nh * hd);
  DeviceVec<int32_t> d_tables(tables), d_q_start(q_start), d_start(start_pos);
  PrefillAttentionParams p;
  p.out = d_out.get();
  p.q = d_q.get();
  p.kv_layer = d_pool.get();
  p.block_tables = d_tables.get();
  p.q_start = d_q_start.get();
  p.start_pos = d_start.get();
  p.num_seqs = S;
  p.num_heads = nh;
  p.num_kv_heads = nkv;
  p.head_dim = hd;
  p.block_size = bs;
  p.max_blocks_per_seq = max_blocks;
  p.max_q_len = max_new;
  p.scale = 1.f / std::sqrt(float(hd));
  p.dtype = c.dtype;
  ASSERT_TRUE(PrefillAttentionSupported(p));
  ASSERT_CUDA(PrefillAttention(p, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<uint16_t> out = d_out.Download();

  const double tol = c.dtype == DType::kF16 ? 2e-3 : 1.6e-2;
  auto kv_at = [&](int s, int key, int h, int d, int which) {
    const int block = tables[size_t(s) * max_blocks + key / bs];
    const size_t idx = (size_t(block) * 2 * nkv + size_t(which) * nkv + h) * tile +
                       size_t(key % bs) * hd + d;
    return double(HalfBitsToF(pool[idx], c.dtype));
  };
  double max_err = 0;
  for (int s = 0; s < S; ++s) {
    for (int i = 0; i < seqs[s].second; ++i) {
      const int t = q_start[s] + i, pos = seqs[s].first + i;
      for (int h = 0; h < nh; ++h) {
        const int kvh = h / group;
        std::vector<double> sc(pos + 1);
        double m = -1e300;
        for (int key = 0; key <= pos; ++key) {
          double dot = 0;
          for (int d = 0; d < hd; ++d) {
            dot += double(HalfBitsToF(q[(size_t(t) * nh + h) * hd + d], c.dtype)) *
                   kv_at(s, key, kvh, d, 0);
          }
          sc[key] = dot / std::sqrt(double(hd));
          m = std::max(m, sc[key]);
        }
        double l = 0;
        for (double& v : sc) l += (v = std::exp(v - m));
        for (int d = 0; d < hd; ++d) {
          double o = 0;
          for (int key = 0; key <= pos; ++key) o += sc[key] * kv_at(s, key, kvh, d, 1);
          o /= l;
          const double got = HalfBitsToF(out[(size_t(t) * nh + h) * hd + d], c.dtype);
          max_err = std::max(max_err, std::fabs(got - o));
          ASSERT_NEAR(o, got, tol * (1 + std::fabs(o)))
              << "seq " << s << " token " << i << " head " << h << " dim " << d;
        }
      }
    }
  }
  std::printf("max abs error %.3g\n", max_err);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PagedTest,
    ::testing::Values(PagedCase{DType::kF16, 128, 16, 8, 2}, PagedCase{DType::kBF16, 128, 16, 8, 2},
                      PagedCase{DType::kF16, 64, 32, 4, 4}, PagedCase{DType::kBF16, 64, 16, 7, 1},
                      PagedCase{DType::kF16, 256, 16, 4, 1}, PagedCase{DType::kBF16, 256, 32, 2, 2},
                      PagedCase{DType::kF16, 128, 32, 28, 4}, PagedCase{DType::kF16, 32, 16, 8, 4},
                      PagedCase{DType::kBF16, 32, 32, 8, 8}),
    CaseName);

}  // namespace
}  // namespace kvstream::kernels

namespace kvstream::kernels {
namespace {

// Not a pass/fail check: prints the prefill attention rate at llama-3-8b's shape (32/8 heads,
// head 128, f16, block 16) for one 2048-token prompt, for the record.
TEST(PrefillAttentionRate, Llama3Shape2kPrompt) {
  const int nh = 32, nkv = 8, hd = 128, bs = 16, T = 2048;
  const int blocks = T / bs;
  std::vector<int32_t> table(blocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(1));
  DeviceVec<uint16_t> pool(size_t(blocks) * 2 * nkv * bs * hd);
  DeviceVec<uint16_t> q(size_t(T) * nh * hd), out(size_t(T) * nh * hd);
  ASSERT_CUDA(DummyFill(pool.get(), DType::kF16, pool.size(), 1, 1, 0, 1.f, 0.f, nullptr));
  ASSERT_CUDA(DummyFill(q.get(), DType::kF16, q.size(), 1, 2, 0, 1.f, 0.f, nullptr));
  DeviceVec<int32_t> d_table(table), q_start(std::vector<int32_t>{0, T}),
      start(std::vector<int32_t>{0});
  PrefillAttentionParams p;
  p.out = out.get();
  p.q = q.get();
  p.kv_layer = pool.get();
  p.block_tables = d_table.get();
  p.q_start = q_start.get();
  p.start_pos = start.get();
  p.num_seqs = 1;
  p.num_heads = nh;
  p.num_kv_heads = nkv;
  p.head_dim = hd;
  p.block_size = bs;
  p.max_blocks_per_seq = blocks;
  p.max_q_len = T;
  p.scale = 1.f / std::sqrt(float(hd));
  p.dtype = DType::kF16;
  ASSERT_CUDA(PrefillAttention(p, nullptr));  // warm-up
  cudaEvent_t e0, e1;
  ASSERT_CUDA(cudaEventCreate(&e0));
  ASSERT_CUDA(cudaEventCreate(&e1));
  const int iters = 10;
  ASSERT_CUDA(cudaEventRecord(e0, nullptr));
  for (int i = 0; i < iters; ++i) ASSERT_CUDA(PrefillAttention(p, nullptr));
  ASSERT_CUDA(cudaEventRecord(e1, nullptr));
  ASSERT_CUDA(cudaEventSynchronize(e1));
  float ms = 0;
  ASSERT_CUDA(cudaEventElapsedTime(&ms, e0, e1));
  ms /= iters;
  const double flops = 4.0 * nh * hd * (double(T) * (T + 1) / 2);
  std::printf("prefill attention, llama-3-8b shape, %d-token prompt: %.3f ms per layer, %.1f "
              "TFLOP/s (causal FLOPs)\n", T, ms, flops / (ms * 1e-3) / 1e12);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace
}  // namespace kvstream::kernels
