// The CUDA sampler (kernels/sampling.h, and the CUDA backend's use of it) against the CPU
// reference (model/sampling.h): from the same logits, the same token, always (the arithmetic is
// shared and exact: common/sampling_math.h); log-probabilities within float tolerance; the
// distribution of many draws (chi-square); independence from the batch.
#include "kernels/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/sampling_math.h"
#include "model/backend.h"
#include "model/generate.h"
#include "model/sampling.h"
#include "tests/model/gpu_util.h"
#include "tests/model/sampling_gpu_helpers.h"

namespace kvstream::testing_gpu {
namespace {

namespace sm = kvstream::sampling;
using model::SamplingParams;
using model::SeqSampling;

SamplingParams Sampled(float t, int k = 0, float p = 1, float min_p = 0, uint64_t seed = 1,
                       int top_logprobs = -1) {
  SamplingParams s;
  s.temperature = t;
  s.top_k = k;
  s.top_p = p;
  s.min_p = min_p;
  s.seed = seed;
  s.logprobs = top_logprobs >= 0;
  s.top_logprobs = std::max(top_logprobs, 0);
  return s;
}

struct GpuResult {
  std::vector<int32_t> tokens;
  std::vector<model::TokenLogprobs> logprobs;
};

// Runs kernels::SampleRows over rows x vocab logits with the CUDA backend's parameter mapping
// (model/cuda/cuda_sampler.cc).
GpuResult RunKernel(const std::vector<float>& logits, int rows, int vocab,
                    const std::vector<SeqSampling>& seqs,
                    kernels::SamplePath path = kernels::SamplePath::kAuto) {
  std::vector<kernels::SampleParams> kp(rows);
  bool any_lp = false;
  for (int r = 0; r < rows; ++r) {
    const SamplingParams& p = seqs[r].params;
    if (!p.greedy()) {
      kp[r].inv_temperature = model::InvTemperature(p.temperature);
      kp[r].top_p = p.top_p;
      kp[r].top_k = p.top_k;
      kp[r].min_weight = p.min_p > 0 ? sm::MinPWeight(p.min_p) : 0;
      kp[r].seed = p.seed;
      kp[r].token_index = seqs[r].token_index;
    }
    kp[r].top_logprobs = p.wants_logprobs() ? p.top_logprobs : -1;
    any_lp = any_lp || p.wants_logprobs();
  }
  DeviceVec<float> d_logits(logits);
  DeviceVec<kernels::SampleParams> d_params(kp);
  DeviceVec<int32_t> d_tokens(rows);
  DeviceVec<kernels::SampleLogprobs> d_lp(rows);
  GpuResult out;
  EXPECT_EQ(kernels::SampleRows(d_tokens.get(), any_lp ? d_lp.get() : nullptr, d_logits.get(),
                                d_params.get(), rows, vocab, nullptr, path),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  out.tokens = d_tokens.Download();
  const auto lp = d_lp.Download();
  out.logprobs.resize(rows);
  for (int r = 0; r < rows; ++r) {
    if (!seqs[r].params.wants_logprobs()) continue;
    out.logprobs[r].logprob = lp[r].logprob;
    for (int j = 0; j < seqs[r].params.top_logprobs && j < vocab; ++j)
      out.logprobs[r].top.push_back({lp[r].top_ids[j], lp[r].top_logprobs[j]});
  }
  return out;
}

std::vector<float> RandomLogits(int rows, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> z(size_t(rows) * vocab);
  for (int r = 0; r < rows; ++r) {
    std::normal_distribution<float> n(0.f, float(1 + r % 4 * 2));
    for (int i = 0; i < vocab; ++i) z[size_t(r) * vocab + i] = n(rng);
  }
  return z;
}

void ExpectLogprobsClose(const model::TokenLogprobs& gpu, const model::TokenLogprobs& cpu,
                         const std::string& what) {
  EXPECT_NEAR(gpu.logprob, cpu.logprob, 1e-3 + 1e-5 * std::fabs(cpu.logprob)) << what;
  ASSERT_EQ(gpu.top.size(), cpu.top.size()) << what;
  for (size_t j = 0; j < cpu.top.size(); ++j) {
    EXPECT_EQ(gpu.top[j].token, cpu.top[j].token) << what << " top " << j;
    EXPECT_NEAR(gpu.top[j].logprob, cpu.top[j].logprob, 1e-3 + 1e-5 * std::fabs(cpu.top[j].logprob))
        << what << " top " << j;
  }
}

TEST(SamplingGpu, PhiloxMatchesHostAndCurand) {
  std::vector<uint64_t> idx;
  for (uint64_t i = 0; i < 1000; ++i) idx.push_back(i);
  idx.push_back((uint64_t(1) << 32) + 5);
  idx.push_back(uint64_t(1) << 63);
  for (uint64_t seed : {uint64_t(0), uint64_t(1), uint64_t(0xDEADBEEFCAFEF00DULL)}) {
    DeviceVec<uint64_t> d_idx(idx);
    DeviceVec<uint32_t> ours(idx.size()), theirs(idx.size());
    ASSERT_CUDA(PhiloxOnDevice(seed, d_idx.get(), int(idx.size()), ours.get(), theirs.get()));
    ASSERT_CUDA(cudaDeviceSynchronize());
    const auto o = ours.Download(), t = theirs.Download();
    for (size_t i = 0; i < idx.size(); ++i) {
      ASSERT_EQ(o[i], sm::PhiloxFirstOutput(seed, idx[i])) << "index " << idx[i];
      ASSERT_EQ(o[i], t[i]) << "curand differs at index " << idx[i];
    }
  }
}

TEST(SamplingGpu, WeightsAreBitIdenticalToTheHost) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-60.f, 10.f);
  std::vector<float> z(200000);
  for (float& v : z) v = u(rng);
  z[0] = 10.f;
  z[1] = NAN;
  z[2] = -INFINITY;
  z[3] = std::nextafter(10.f, 0.f);
  for (float t : {1.0f, 0.7f, 0.05f, 3.0f, 1e-7f, 1000.f}) {
    const float inv_t = model::InvTemperature(t);
    DeviceVec<float> d_z(z);
    DeviceVec<uint64_t> d_w(z.size());
    ASSERT_CUDA(WeightsOnDevice(d_z.get(), int(z.size()), 10.f, inv_t, d_w.get()));
    ASSERT_CUDA(cudaDeviceSynchronize());
    const auto w = d_w.Download();
    for (size_t i = 0; i < z.size(); ++i)
      ASSERT_EQ(w[i], sm::SampleWeight(z[i], 10.f, inv_t)) << "z " << z[i] << " T " << t;
  }
}

TEST(SamplingGpu, KernelTokensEqualTheCpuReference) {
  const std::vector<SamplingParams> configs = {
      {},
      Sampled(1.0f),
      Sampled(0.7f, 50),
      Sampled(1.0f, 0, 0.9f),
      Sampled(0.8f, 40, 0.95f, 0.05f),
      Sampled(1.5f, 0, 1, 0.1f),
      Sampled(1.0f, 1),
      Sampled(1.0f, 0, 1e-6f),
      Sampled(1000.f, 0, 0.5f),
      Sampled(1e-7f),
      Sampled(0.9f, 20, 0.8f, 0, 3, 5),
      Sampled(0, 0, 1, 0, 0, 0),
      Sampled(1.2f, 0, 0.99f, 0, 9, 20),
      Sampled(0.6f, 100000, 0.97f),
  };
  for (int vocab : {1, 7, 1000, 32000, 128256, 152064}) {
    const int rows = int(configs.size()) + 2;
    std::vector<float> z = RandomLogits(rows, vocab, uint32_t(vocab));
    // Ties at the top and non-finite entries in the last two rows.
    if (vocab > 10) {
      float* a = &z[size_t(rows - 2) * vocab];
      a[3] = a[vocab - 1] = a[vocab / 2] = 50.f;
      float* b = &z[size_t(rows - 1) * vocab];
      b[0] = NAN;
      b[1] = -INFINITY;
      b[vocab - 1] = NAN;
    }
    // Both paths: on Hopper the cluster (vocab >= 16384) and the one-block path of older GPUs.
    for (int rep = 0; rep < 12; ++rep) {
      const auto path = rep % 2 ? kernels::SamplePath::kOneBlock : kernels::SamplePath::kAuto;
      std::vector<SeqSampling> seqs(rows);
      for (int r = 0; r < rows; ++r) {
        seqs[r].params = r < int(configs.size()) ? configs[r] : Sampled(1.0f, 0, 0.9f, 0, 4, 3);
        seqs[r].params.seed += uint64_t(rep) * 1000003u;
        seqs[r].token_index = uint64_t(rep * 7 + r);
      }
      const GpuResult g = RunKernel(z, rows, vocab, seqs, path);
      for (int r = 0; r < rows; ++r) {
        std::span<const float> row(&z[size_t(r) * vocab], size_t(vocab));
        const std::string what = "vocab " + std::to_string(vocab) + " row " + std::to_string(r) +
                                 " rep " + std::to_string(rep) + (rep % 2 ? " one block" : "");
        const int32_t want = model::SampleRow(row, seqs[r].params, seqs[r].token_index);
        ASSERT_EQ(g.tokens[r], want) << what;
        if (seqs[r].params.wants_logprobs() && r != rows - 1)
          ExpectLogprobsClose(g.logprobs[r], model::LogprobsRow(row, want, seqs[r].params.top_logprobs),
                              what);
      }
    }
  }
}

TEST(SamplingGpu, SameTokenWhateverTheBatch) {
  const int vocab = 128256;
  const std::vector<float> one = RandomLogits(1, vocab, 11);
  std::vector<float> many = RandomLogits(32, vocab, 12);
  std::copy(one.begin(), one.end(), many.begin() + size_t(17) * vocab);
  for (uint64_t i = 0; i < 20; ++i) {
    const SamplingParams p = Sampled(1.0f, 0, 0.95f, 0, 77);
    const GpuResult alone = RunKernel(one, 1, vocab, {SeqSampling{p, i}},
                                      i % 2 ? kernels::SamplePath::kOneBlock : kernels::SamplePath::kAuto);
    std::vector<SeqSampling> seqs(32, SeqSampling{Sampled(0.5f, 10, 1, 0, 5), i + 100});
    seqs[17] = SeqSampling{p, i};
    const GpuResult batch = RunKernel(many, 32, vocab, seqs);
    EXPECT_EQ(alone.tokens[0], batch.tokens[17]) << "index " << i;
  }
}

TEST(SamplingGpu, ManyDrawsFollowTheDistribution) {
  const std::vector<float> logits = {1.0f, 2.5f, 0.3f, -1.0f, 2.5f, 0.9f, -3.0f, 1.7f};
  const int V = int(logits.size()), draws = 40000;
  for (const SamplingParams& p :
       {Sampled(1.0f, 0, 1, 0, 5), Sampled(0.8f, 5, 0.9f, 0, 6), Sampled(1.0f, 0, 1, 0.2f, 7)}) {
    std::vector<float> z;
    std::vector<SeqSampling> seqs;
    for (int i = 0; i < draws; ++i) {
      z.insert(z.end(), logits.begin(), logits.end());
      seqs.push_back({p, uint64_t(i)});
    }
    const GpuResult g = RunKernel(z, draws, V, seqs);
    std::vector<int> counts(V, 0);
    for (int32_t t : g.tokens) ++counts[t];
    // The definition in double: softmax at T, top-k, top-p over it, min-p (no ties at the cuts
    // for these parameters).
    std::vector<double> e(V);
    const double m = 2.5;
    for (int i = 0; i < V; ++i) e[i] = std::exp((logits[i] - m) / p.temperature);
    std::vector<int> order(V);
    for (int i = 0; i < V; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    std::vector<bool> keep(V, true);
    if (p.top_k > 0)
      for (int i = 0; i < V; ++i) keep[i] = logits[i] >= logits[order[p.top_k - 1]];
    if (p.top_p < 1) {
      double tot = 0, mass = 0;
      for (int i = 0; i < V; ++i) tot += keep[i] ? e[i] : 0;
      float cut = logits[order[0]];
      for (int j = 0; j < V; ++j) {
        if (!keep[order[j]]) continue;
        mass += e[order[j]];
        cut = logits[order[j]];
        if ((j + 1 == V || logits[order[j + 1]] != logits[order[j]]) && mass >= p.top_p * tot) break;
      }
      for (int i = 0; i < V; ++i) keep[i] = keep[i] && logits[i] >= cut;
    }
    double sum = 0;
    for (int i = 0; i < V; ++i) {
      keep[i] = keep[i] && e[i] >= p.min_p;
      sum += keep[i] ? e[i] : 0;
    }
    double chi = 0;
    int df = -1;
    for (int i = 0; i < V; ++i) {
      if (!keep[i]) {
        EXPECT_EQ(counts[i], 0) << "token " << i << " filtered out but drawn";
        continue;
      }
      const double want = e[i] / sum * draws;
      chi += (counts[i] - want) * (counts[i] - want) / want;
      ++df;
    }
    static const double q[] = {0, 15.14, 18.42, 21.11, 23.51, 25.74, 27.86, 29.88};
    ASSERT_GE(df, 1);
    EXPECT_LT(chi, q[df]) << "chi-square with " << df << " df";
  }
}

TEST(SamplingGpu, TopLogprobsWithManyTiesTakeTheLowestIndices) {
  const int vocab = 5000;
  std::vector<float> z(vocab, 1.0f);
  z[4000] = 3.0f;
  z[10] = 2.0f;
  const SamplingParams p = Sampled(0, 0, 1, 0, 0, 20);
  const GpuResult g = RunKernel(z, 1, vocab, {SeqSampling{p, 0}});
  ExpectLogprobsClose(g.logprobs[0], model::LogprobsRow(z, 4000, 20), "ties");
  EXPECT_EQ(g.tokens[0], 4000);
  ASSERT_EQ(g.logprobs[0].top.size(), 20u);
  EXPECT_EQ(g.logprobs[0].top[2].token, 0);
  EXPECT_EQ(g.logprobs[0].top[19].token, 18);
}

TEST(CudaBackendSampling, ForwardSamplesTheLogitsItReturns) {
  model::ModelSpec spec;
  spec.model = "tiny";
  model::BackendOptions bo;
  bo.kind = "cuda";
  auto be = model::CreateBackend(spec, bo);
  ASSERT_TRUE(be.ok()) << be.status().ToString();
  auto& backend = **be;
  const int vocab = backend.config().vocab_size;
  auto pool = backend.CreatePool(64, 16).value();
  std::vector<std::vector<int32_t>> prompts, tables;
  std::vector<model::SeqInput> seqs;
  for (int s = 0; s < 4; ++s) {
    std::vector<int32_t> p(5 + s * 9);
    for (size_t i = 0; i < p.size(); ++i) p[i] = int32_t((i * 31 + s * 7) % vocab);
    prompts.push_back(p);
    std::vector<int32_t> t;
    for (int b = 0; b < model::BlocksForTokens(int(p.size()), 16); ++b) t.push_back(s * 8 + b);
    tables.push_back(t);
  }
  for (int s = 0; s < 4; ++s) seqs.push_back(model::SeqInput{prompts[s], 0, tables[s]});
  const std::vector<SeqSampling> sampling = {
      {{}, 0}, {Sampled(1.0f, 0, 0.9f, 0, 3), 0}, {Sampled(0.7f, 20, 1, 0, 4, 5), 0},
      {Sampled(1.3f, 0, 1, 0.05f, 5, 0), 0}};
  model::ForwardOptions fo;
  fo.want_logits = true;
  fo.sampling = sampling;
  model::ForwardOutput out;
  ASSERT_TRUE(backend.Forward(*pool, seqs, nullptr, fo, &out).ok());
  std::vector<int32_t> want;
  std::vector<model::TokenLogprobs> want_lp;
  model::SampleRows(out.logits.data(), 4, vocab, sampling, &want, &want_lp);
  EXPECT_EQ(out.next_tokens, want);
  ASSERT_EQ(out.logprobs.size(), 4u);
  for (int s : {2, 3}) ExpectLogprobsClose(out.logprobs[s], want_lp[s], "seq " + std::to_string(s));

  // Generate with sampling on the GPU: the same tokens every time.
  model::GenerateOptions go;
  go.max_new_tokens = 12;
  go.sampling = Sampled(1.1f, 40, 0.95f, 0, 99);
  auto gen_pool = backend.CreatePool(32, 16).value();
  auto a = model::Generate(backend, *gen_pool, prompts[1], go);
  auto b = model::Generate(backend, *gen_pool, prompts[1], go);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tokens, b->tokens);
}

}  // namespace
}  // namespace kvstream::testing_gpu
