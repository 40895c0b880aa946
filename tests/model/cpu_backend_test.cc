// The CPU reference backend against an independent double-precision implementation written
// here from the textbook formulas (attention as softmax(QK^T / sqrt(d) + causal mask) V), and
// the cache properties every other path relies on.
#include "model/cpu_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "model/generate.h"
#include "model/weights.h"

namespace kvstream::model {
namespace {

ModelConfig TinyConfig(DType wd, DType kd, uint64_t seed = 7) {
  ModelConfig c = PresetConfig("tiny", seed).value();
  c.weight_dtype = wd;
  c.kv_dtype = kd;
  return c;
}

// Qwen2-shaped variant: QKV bias, tied embeddings, another GQA ratio and head size.
ModelConfig TinyQwenConfig(DType wd, DType kd) {
  ModelConfig c = TinyConfig(wd, kd, 11);
  c.name = "tiny-qwen";
  c.family = "qwen2";
  c.qkv_bias = true;
  c.tie_word_embeddings = true;
  c.num_heads = 6;
  c.num_kv_heads = 2;
  c.head_dim = 48;
  c.hidden_size = 192;
  c.rope_theta = 1e6f;
  c.rms_eps = 1e-6f;
  return c;
}

std::unique_ptr<ModelBackend> MakeBackend(const ModelConfig& c, int threads = 2) {
  auto w = DummyWeightsFor(c);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  auto b = CreateCpuBackend(**w, threads);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return std::move(b).value();
}

// ---- independent reference in double -------------------------------------------------------
class RefModel {
 public:
  explicit RefModel(const ModelConfig& c) : c_(c) {
    auto w = DummyWeightsFor(c).value();
    for (const auto& t : w->tensors()) {
      std::vector<float> f;
      EXPECT_TRUE(w->ReadF32(t, &f).ok());
      w_[t.name] = std::vector<double>(f.begin(), f.end());
    }
  }
  // Logits [T][vocab] for every position of `tokens`; also the K of layer 0 (post-RoPE).
  std::vector<std::vector<double>> Logits(const std::vector<int32_t>& tokens,
                                          std::vector<std::vector<double>>* k0 = nullptr) {
    const int T = static_cast<int>(tokens.size()), H = c_.hidden_size, HD = c_.head_dim;
    std::vector<std::vector<double>> x(T);
    for (int t = 0; t < T; ++t)
      x[t] = Slice(W("model.embed_tokens.weight"), size_t(tokens[t]) * H, H);
    for (int l = 0; l < c_.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      std::vector<std::vector<double>> q(T), k(T), v(T);
      for (int t = 0; t < T; ++t) {
        auto xn = Norm(x[t], W(p + "input_layernorm.weight"));
        q[t] = Linear(xn, W(p + "self_attn.q_proj.weight"), c_.q_dim());
        k[t] = Linear(xn, W(p + "self_attn.k_proj.weight"), c_.kv_dim());
        v[t] = Linear(xn, W(p + "self_attn.v_proj.weight"), c_.kv_dim());
        if (c_.qkv_bias) {
          for (int i = 0; i < c_.q_dim(); ++i) q[t][i] += W(p + "self_attn.q_proj.bias")[i];
          for (int i = 0; i < c_.kv_dim(); ++i) k[t][i] += W(p + "self_attn.k_proj.bias")[i];
          for (int i = 0; i < c_.kv_dim(); ++i) v[t][i] += W(p + "self_attn.v_proj.bias")[i];
        }
        for (int h = 0; h < c_.num_heads; ++h) Rope(&q[t][h * HD], t);
        for (int h = 0; h < c_.num_kv_heads; ++h) Rope(&k[t][h * HD], t);
      }
      if (l == 0 && k0) *k0 = k;
      std::vector<std::vector<double>> attn(T, std::vector<double>(c_.q_dim()));
      for (int h = 0; h < c_.num_heads; ++h) {
        const int kh = h / c_.group_size();
        // S = Q K^T / sqrt(d) with a causal mask; P = softmax(S); O = P V.
        std::vector<std::vector<double>> S(T, std::vector<double>(T, -INFINITY));
        for (int i = 0; i < T; ++i)
          for (int j = 0; j <= i; ++j) {
            double s = 0;
            for (int d = 0; d < HD; ++d) s += q[i][h * HD + d] * k[j][kh * HD + d];
            S[i][j] = s / std::sqrt(double(HD));
          }
        for (int i = 0; i < T; ++i) {
          double mx = *std::max_element(S[i].begin(), S[i].end()), z = 0;
          std::vector<double> P(T);
          for (int j = 0; j < T; ++j) z += (P[j] = std::exp(S[i][j] - mx));
          for (int d = 0; d < HD; ++d) {
            double o = 0;
            for (int j = 0; j < T; ++j) o += P[j] / z * v[j][kh * HD + d];
            attn[i][h * HD + d] = o;
          }
        }
      }
      for (int t = 0; t < T; ++t) {
        auto o = Linear(attn[t], W(p + "self_attn.o_proj.weight"), H);
        for (int i = 0; i < H; ++i) x[t][i] += o[i];
        auto xn = Norm(x[t], W(p + "post_attention_layernorm.weight"));
        auto g = Linear(xn, W(p + "mlp.gate_proj.weight"), c_.intermediate_size);
        auto u = Linear(xn, W(p + "mlp.up_proj.weight"), c_.intermediate_size);
        for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
        auto d = Linear(g, W(p + "mlp.down_proj.weight"), H);
        for (int i = 0; i < H; ++i) x[t][i] += d[i];
      }
    }
    std::vector<std::vector<double>> out(T);
    const auto& head = W(c_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
    for (int t = 0; t < T; ++t) out[t] = Linear(Norm(x[t], W("model.norm.weight")), head, c_.vocab_size);
    return out;
  }

 private:
  const std::vector<double>& W(const std::string& n) { return w_.at(n); }
  static std::vector<double> Slice(const std::vector<double>& v, size_t off, size_t n) {
    return std::vector<double>(v.begin() + off, v.begin() + off + n);
  }
  std::vector<double> Norm(const std::vector<double>& x, const std::vector<double>& w) {
    double ms = 0;
    for (double a : x) ms += a * a;
    double inv = 1 / std::sqrt(ms / x.size() + c_.rms_eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
    return y;
  }
  static std::vector<double> Linear(const std::vector<double>& x, const std::vector<double>& w, int out) {
    std::vector<double> y(out);
    for (int r = 0; r < out; ++r) {
      double s = 0;
      for (size_t k = 0; k < x.size(); ++k) s += w[r * x.size() + k] * x[k];
      y[r] = s;
    }
    return y;
  }
  void Rope(double* x, int pos) {
    const int half = c_.head_dim / 2;
    for (int i = 0; i < half; ++i) {
      double a = pos * std::pow(double(c_.rope_theta), -2.0 * i / c_.head_dim);
      double x0 = x[i], x1 = x[i + half];
      x[i] = x0 * std::cos(a) - x1 * std::sin(a);
      x[i + half] = x1 * std::cos(a) + x0 * std::sin(a);
    }
  }
  ModelConfig c_;
  std::map<std::string, std::vector<double>> w_;
};

GenerateOptions Opts(int n, std::optional<int32_t> stop = std::nullopt, LayerHooks* hooks = nullptr) {
  GenerateOptions o;
  o.max_new_tokens = n;
  o.stop_token = stop;
  o.hooks = hooks;
  return o;
}

std::vector<int32_t> Prompt(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = static_cast<int32_t>(rng() % vocab);
  return p;
}

// A scrambled block table: blocks of a request need not be contiguous or ordered.
std::vector<int32_t> Scrambled(KvPool& pool, int tokens, uint32_t seed) {
  auto ids = pool.allocator().Allocate(BlocksForTokens(tokens, pool.layout().block_size)).value();
  std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  return ids;
}

TEST(CpuBackend, Dot4IsBitIdenticalToDot) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1, 1);
  for (int n : {1, 7, 8, 9, 31, 256, 1000}) {
    std::vector<float> a(n), b[4];
    for (auto& x : a) x = d(rng);
    const float* rows[4];
    for (int r = 0; r < 4; ++r) {
      b[r].resize(n);
      for (auto& x : b[r]) x = d(rng);
      rows[r] = b[r].data();
    }
    float out[4];
    ReferenceDot4(a.data(), rows, n, out);
    for (int r = 0; r < 4; ++r) {
      const float one = ReferenceDot(a.data(), rows[r], n);
      EXPECT_EQ(std::memcmp(&out[r], &one, 4), 0) << "n " << n << " row " << r;
      double exact = 0;
      for (int i = 0; i < n; ++i) exact += double(a[i]) * b[r][i];
      EXPECT_NEAR(one, exact, 1e-4 * std::sqrt(double(n)));
    }
  }
}

struct Case {
  const char* name;
  ModelConfig config;
  double tol;
};

TEST(CpuBackend, MatchesDoublePrecisionReference) {
  for (const Case& cs : {Case{"tiny f32 weights, f32 kv", TinyConfig(DType::kF32, DType::kF32), 2e-4},
                         Case{"tiny bf16 weights, f32 kv", TinyConfig(DType::kBF16, DType::kF32), 2e-4},
                         Case{"qwen-ish f16 weights, f32 kv", TinyQwenConfig(DType::kF16, DType::kF32), 2e-4},
                         Case{"tiny f16 weights, f16 kv", TinyConfig(DType::kF16, DType::kF16), 3e-2}}) {
    SCOPED_TRACE(cs.name);
    const ModelConfig& c = cs.config;
    auto backend = MakeBackend(c);
    auto pool = backend->CreatePool(16, 4).value();
    const auto prompt = Prompt(21, c.vocab_size, 3);
    RefModel ref(c);
    std::vector<std::vector<double>> ref_k0;
    const auto want = ref.Logits(prompt, &ref_k0);
    const auto table = Scrambled(*pool, 21, 5);
    ForwardOutput out;
    SeqInput in{prompt, 0, table};
    ASSERT_TRUE(backend->Forward(*pool, {&in, 1}, nullptr, ForwardOptions{.want_logits = true}, &out).ok());
    ASSERT_EQ(out.logits.size(), size_t(c.vocab_size));
    double max_err = 0, max_abs = 0;
    for (int i = 0; i < c.vocab_size; ++i) {
      max_err = std::max(max_err, std::abs(out.logits[i] - want.back()[i]));
      max_abs = std::max(max_abs, std::abs(want.back()[i]));
    }
    EXPECT_LT(max_err, cs.tol) << "max |logit| " << max_abs;
    EXPECT_GT(max_abs, 0.5);  // the logits are not degenerate
    int best = int(std::max_element(want.back().begin(), want.back().end()) - want.back().begin());
    if (cs.tol < 1e-3) {
      EXPECT_EQ(out.next_tokens[0], best);
    }
    // The pool holds layer 0's post-RoPE K at each position, through the scrambled table.
    const KvLayout& lay = pool->layout();
    for (int p = 0; p < 21; ++p)
      for (int h = 0; h < c.num_kv_heads; ++h) {
        const std::byte* kp = pool->block_ptr(0, table[p / 4]) +
                              ((size_t(0) * c.num_kv_heads + h) * 4 + p % 4) * c.head_dim * lay.elem_bytes();
        for (int d = 0; d < c.head_dim; ++d)
          ASSERT_NEAR(LoadAsF32(kp, lay.dtype, d), ref_k0[p][h * c.head_dim + d],
                      lay.dtype == DType::kF32 ? 1e-4 : 1e-2 * (1 + std::abs(ref_k0[p][h * c.head_dim + d])))
              << "pos " << p << " head " << h << " dim " << d;
      }
  }
}

std::vector<std::byte> PoolBytes(KvPool& pool, const std::vector<int32_t>& table) {
  std::vector<std::byte> out;
  for (int l = 0; l < pool.layout().num_layers; ++l)
    for (int32_t b : table) {
      const std::byte* p = pool.block_ptr(l, b);
      out.insert(out.end(), p, p + pool.layout().block_bytes());
    }
  return out;
}

TEST(CpuBackend, SplitPrefillIsBitIdentical) {
  for (DType kd : {DType::kF16, DType::kBF16}) {
    const ModelConfig c = TinyConfig(DType::kF16, kd);
    auto backend = MakeBackend(c);
    auto pool_a = backend->CreatePool(16, 16).value();
    auto pool_b = backend->CreatePool(16, 16).value();
    const auto prompt = Prompt(37, c.vocab_size, 9);
    auto ta = Scrambled(*pool_a, 37, 1), tb = Scrambled(*pool_b, 37, 1);
    ForwardOutput one, part, last;
    SeqInput in{prompt, 0, ta};
    ASSERT_TRUE(backend->Forward(*pool_a, {&in, 1}, nullptr, {.want_logits = true}, &one).ok());
    std::span<const int32_t> all(prompt);
    SeqInput first{all.first(36), 0, tb};
    ASSERT_TRUE(backend->Forward(*pool_b, {&first, 1}, nullptr, {.skip_lm_head = true}, &part).ok());
    EXPECT_EQ(part.next_tokens, std::vector<int32_t>{-1});
    SeqInput second{all.subspan(36), 36, tb};
    ASSERT_TRUE(backend->Forward(*pool_b, {&second, 1}, nullptr, {.want_logits = true}, &last).ok());
    EXPECT_EQ(one.next_tokens, last.next_tokens);
    ASSERT_EQ(one.logits.size(), last.logits.size());
    EXPECT_EQ(std::memcmp(one.logits.data(), last.logits.data(), one.logits.size() * 4), 0);
    EXPECT_TRUE(PoolBytes(*pool_a, ta) == PoolBytes(*pool_b, tb));
  }
}

TEST(CpuBackend, DecodeWithCacheEqualsFreshPrefill) {
  for (const ModelConfig& c : {TinyConfig(DType::kBF16, DType::kBF16), TinyQwenConfig(DType::kF16, DType::kF16)}) {
    auto backend = MakeBackend(c);
    auto pool = backend->CreatePool(32, 8).value();
    auto prompt = Prompt(13, c.vocab_size, 21);
    // Decode with the cache, recording the logits of each step.
    BlockLease lease(&pool->allocator(), {});
    std::vector<int32_t> seq = prompt;
    std::vector<std::vector<float>> step_logits;
    int start = 0;
    for (int step = 0; step < 6; ++step) {
      ASSERT_TRUE(lease.GrowToTokens(int(seq.size()), 8).ok());
      ForwardOutput out;
      SeqInput in{std::span<const int32_t>(seq).subspan(start), start, lease.ids()};
      ASSERT_TRUE(backend->Forward(*pool, {&in, 1}, nullptr, {.want_logits = true}, &out).ok());
      step_logits.push_back(out.logits);
      start = int(seq.size());
      seq.push_back(out.next_tokens[0]);
    }
    // Fresh prefill over each extended sequence, in a fresh pool.
    for (int step = 0; step < 6; ++step) {
      std::vector<int32_t> prefix(seq.begin(), seq.begin() + prompt.size() + step);
      auto fresh = backend->CreatePool(32, 8).value();
      auto table = Scrambled(*fresh, int(prefix.size()), step);
      ForwardOutput out;
      SeqInput in{prefix, 0, table};
      ASSERT_TRUE(backend->Forward(*fresh, {&in, 1}, nullptr, {.want_logits = true}, &out).ok());
      EXPECT_EQ(out.next_tokens[0], seq[prompt.size() + step]) << "step " << step;
      for (int i = 0; i < c.vocab_size; ++i)
        ASSERT_NEAR(out.logits[i], step_logits[step][i], 1e-5) << "step " << step << " logit " << i;
    }
  }
}

TEST(CpuBackend, IndependentOfThreadsAndBatch) {
  const ModelConfig c = TinyConfig(DType::kBF16, DType::kF16);
  auto b1 = MakeBackend(c, 1), b3 = MakeBackend(c, 3);
  const auto pa = Prompt(19, c.vocab_size, 1), pb = Prompt(5, c.vocab_size, 2);
  auto run = [&](ModelBackend& b, std::vector<std::vector<int32_t>> prompts) {
    auto pool = b.CreatePool(32, 16).value();
    std::vector<std::vector<int32_t>> tables;
    std::vector<SeqInput> batch;
    for (auto& p : prompts) tables.push_back(Scrambled(*pool, int(p.size()), 3));
    for (size_t i = 0; i < prompts.size(); ++i) batch.push_back({prompts[i], 0, tables[i]});
    ForwardOutput out;
    EXPECT_TRUE(b.Forward(*pool, batch, nullptr, {.want_logits = true}, &out).ok());
    return out;
  };
  auto one_a = run(*b1, {pa}), one_b = run(*b1, {pb});
  auto three_ab = run(*b3, {pa, pb});
  ASSERT_EQ(three_ab.logits.size(), size_t(2 * c.vocab_size));
  EXPECT_EQ(std::memcmp(one_a.logits.data(), three_ab.logits.data(), 4 * c.vocab_size), 0);
  EXPECT_EQ(std::memcmp(one_b.logits.data(), three_ab.logits.data() + c.vocab_size, 4 * c.vocab_size), 0);
  EXPECT_EQ(three_ab.next_tokens, (std::vector<int32_t>{one_a.next_tokens[0], one_b.next_tokens[0]}));
}

class RecordingHooks : public LayerHooks {
 public:
  Status BeforeAttention(int layer, void*) override {
    events.push_back("before" + std::to_string(layer));
    return layer == fail_at ? Canceled("stop at " + std::to_string(layer)) : OkStatus();
  }
  Status AfterLayer(int layer, void*) override {
    events.push_back("after" + std::to_string(layer));
    return OkStatus();
  }
  std::vector<std::string> events;
  int fail_at = -1;
};

TEST(CpuBackend, HooksInOrderAndErrorsAbort) {
  const ModelConfig c = TinyConfig(DType::kF16, DType::kF16);
  auto backend = MakeBackend(c);
  auto pool = backend->CreatePool(8, 16).value();
  const auto prompt = Prompt(5, c.vocab_size, 4);
  auto table = pool->allocator().Allocate(1).value();
  RecordingHooks hooks;
  ForwardOutput out;
  SeqInput in{prompt, 0, table};
  ASSERT_TRUE(backend->Forward(*pool, {&in, 1}, &hooks, {}, &out).ok());
  EXPECT_EQ(hooks.events, (std::vector<std::string>{"before0", "after0", "before1", "after1"}));
  RecordingHooks failing;
  failing.fail_at = 1;
  Status s = backend->Forward(*pool, {&in, 1}, &failing, {}, &out);
  EXPECT_EQ(s.code(), StatusCode::kCanceled);
  EXPECT_EQ(s.message(), "stop at 1");
  EXPECT_EQ(failing.events, (std::vector<std::string>{"before0", "after0", "before1"}));
}

// Two Forwards on one backend at once, one waiting in BeforeAttention for the other's
// AfterLayer of the same layer (a prefill and a decode sharing a backend in one process).
class LayerGate : public LayerHooks {
 public:
  Status AfterLayer(int layer, void*) override {
    std::lock_guard<std::mutex> l(mu);
    done = std::max(done, layer + 1);
    cv.notify_all();
    return OkStatus();
  }
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
};
class WaitFor : public LayerHooks {
 public:
  explicit WaitFor(LayerGate* g) : g_(g) {}
  Status BeforeAttention(int layer, void*) override {
    std::unique_lock<std::mutex> l(g_->mu);
    if (!g_->cv.wait_for(l, std::chrono::seconds(20), [&] { return g_->done > layer; }))
      return Timeout("layer " + std::to_string(layer));
    return OkStatus();
  }
  LayerGate* g_;
};

TEST(CpuBackend, ConcurrentForwardsInterleaveLayerByLayer) {
  const ModelConfig c = TinyConfig(DType::kF16, DType::kF16);
  auto backend = MakeBackend(c, 2);
  auto pa = backend->CreatePool(8, 16).value(), pb = backend->CreatePool(8, 16).value();
  const auto p1 = Prompt(30, c.vocab_size, 1), p2 = Prompt(9, c.vocab_size, 2);
  auto ta = pa->allocator().Allocate(2).value(), tb = pb->allocator().Allocate(1).value();
  // Expected results, sequentially.
  ForwardOutput want1, want2;
  {
    auto qa = backend->CreatePool(8, 16).value(), qb = backend->CreatePool(8, 16).value();
    SeqInput a{p1, 0, ta}, b{p2, 0, tb};
    ASSERT_TRUE(backend->Forward(*qa, {&a, 1}, nullptr, {.want_logits = true}, &want1).ok());
    ASSERT_TRUE(backend->Forward(*qb, {&b, 1}, nullptr, {.want_logits = true}, &want2).ok());
  }
  LayerGate gate;
  WaitFor waiter(&gate);
  ForwardOutput got1, got2;
  Status s2;
  std::thread second([&] {
    SeqInput b{p2, 0, tb};
    s2 = backend->Forward(*pb, {&b, 1}, &waiter, {.want_logits = true}, &got2);
  });
  SeqInput a{p1, 0, ta};
  Status s1 = backend->Forward(*pa, {&a, 1}, &gate, {.want_logits = true}, &got1);
  second.join();
  ASSERT_TRUE(s1.ok()) << s1.ToString();
  ASSERT_TRUE(s2.ok()) << s2.ToString();
  EXPECT_EQ(got1.logits, want1.logits);
  EXPECT_EQ(got2.logits, want2.logits);
}

TEST(CpuBackend, BadInputIsAnErrorNotACrash) {
  const ModelConfig c = TinyConfig(DType::kF16, DType::kF16);
  auto backend = MakeBackend(c);
  auto pool = backend->CreatePool(4, 16).value();
  ForwardOutput out;
  std::vector<int32_t> ok_tokens = {1, 2, 3}, bad_tokens = {1, c.vocab_size}, neg = {-1};
  std::vector<int32_t> table = {0}, bad_table = {9}, empty_table = {};
  auto fwd = [&](std::span<const int32_t> toks, int start, std::span<const int32_t> tab) {
    SeqInput in{toks, start, tab};
    return backend->Forward(*pool, {&in, 1}, nullptr, {}, &out).code();
  };
  EXPECT_EQ(fwd(bad_tokens, 0, table), StatusCode::kInvalidArgument);
  EXPECT_EQ(fwd(neg, 0, table), StatusCode::kInvalidArgument);
  EXPECT_EQ(fwd(ok_tokens, 0, bad_table), StatusCode::kInvalidArgument);
  EXPECT_EQ(fwd(ok_tokens, 0, empty_table), StatusCode::kInvalidArgument);
  EXPECT_EQ(fwd(ok_tokens, 14, table), StatusCode::kInvalidArgument);  // 17 tokens > 1 block
  EXPECT_EQ(fwd({}, 0, table), StatusCode::kInvalidArgument);
  EXPECT_EQ(fwd(ok_tokens, -1, table), StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->Forward(*pool, {}, nullptr, {}, &out).code(), StatusCode::kInvalidArgument);
  std::vector<int32_t> dup_table = {1, 1};
  std::vector<int32_t> long_tokens(20, 1);
  EXPECT_EQ(fwd(long_tokens, 0, dup_table), StatusCode::kInvalidArgument);
  {
    // Two sequences writing into one block.
    std::vector<int32_t> t0 = {2}, t1 = {2};
    SeqInput two[2] = {{ok_tokens, 0, t0}, {ok_tokens, 0, t1}};
    EXPECT_EQ(backend->Forward(*pool, two, nullptr, {}, &out).code(), StatusCode::kInvalidArgument);
    // Sharing a block they only read (a common prefix) is fine.
    std::vector<int32_t> full(16, 5);
    std::vector<int32_t> prefix = {2}, a = {2, 0}, b = {2, 3};
    SeqInput first{full, 0, prefix};
    ASSERT_TRUE(backend->Forward(*pool, {&first, 1}, nullptr, {}, &out).ok());
    SeqInput shared[2] = {{ok_tokens, 16, a}, {ok_tokens, 16, b}};
    EXPECT_TRUE(backend->Forward(*pool, shared, nullptr, {}, &out).ok());
    EXPECT_EQ(out.next_tokens[0], out.next_tokens[1]);
  }
  // A pool of another layout.
  auto other = CreateHostPool(KvLayout{2, 4, 32, 16, DType::kBF16}, 4).value();
  SeqInput in{ok_tokens, 0, table};
  EXPECT_EQ(backend->Forward(*other, {&in, 1}, nullptr, {}, &out).code(), StatusCode::kInvalidArgument);
}

TEST(Generate, MatchesStepwiseForwardAndFreesBlocks) {
  const ModelConfig c = TinyConfig(DType::kBF16, DType::kBF16);
  auto backend = MakeBackend(c);
  auto pool = backend->CreatePool(16, 4).value();
  const auto prompt = Prompt(10, c.vocab_size, 8);
  auto r = Generate(*backend, *pool, prompt, Opts(7));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tokens.size(), 7u);
  EXPECT_EQ(r->decode_seconds.size(), 6u);
  EXPECT_GT(r->ttft_seconds, 0);
  EXPECT_GE(r->ttft_seconds, r->prefill_seconds);
  EXPECT_EQ(pool->allocator().free_count(), 16);
  // Each generated token is the argmax of a fresh prefill over everything before it.
  std::vector<int32_t> seq = prompt;
  for (int32_t tok : r->tokens) {
    auto fresh = backend->CreatePool(16, 4).value();
    auto table = Scrambled(*fresh, int(seq.size()), 2);
    ForwardOutput out;
    SeqInput in{seq, 0, table};
    ASSERT_TRUE(backend->Forward(*fresh, {&in, 1}, nullptr, {}, &out).ok());
    EXPECT_EQ(out.next_tokens[0], tok);
    seq.push_back(tok);
  }
  // Stop token: generation ends on it, and it is returned.
  auto s = Generate(*backend, *pool, prompt, Opts(7, r->tokens[2]));
  ASSERT_TRUE(s.ok());
  const size_t first = std::find(r->tokens.begin(), r->tokens.end(), r->tokens[2]) - r->tokens.begin();
  EXPECT_EQ(s->tokens, std::vector<int32_t>(r->tokens.begin(), r->tokens.begin() + first + 1));
  EXPECT_TRUE(s->stopped);
  // Exhaustion mid-generation: an error, and every block comes back.
  auto small = backend->CreatePool(3, 4).value();
  auto e = Generate(*backend, *small, prompt, Opts(7));
  EXPECT_EQ(e.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(small->allocator().free_count(), 3);
  // A hook error also frees the blocks.
  RecordingHooks failing;
  failing.fail_at = 0;
  auto h = Generate(*backend, *pool, prompt, Opts(3, std::nullopt, &failing));
  EXPECT_EQ(h.status().code(), StatusCode::kCanceled);
  EXPECT_EQ(pool->allocator().free_count(), 16);
  EXPECT_FALSE(Generate(*backend, *pool, prompt, Opts(0)).ok());
  EXPECT_FALSE(Generate(*backend, *pool, {}, Opts(1)).ok());
}

TEST(Generate, BatchEqualsOneByOne) {
  const ModelConfig c = TinyQwenConfig(DType::kBF16, DType::kF16);
  auto backend = MakeBackend(c);
  auto pool = backend->CreatePool(64, 16).value();
  std::vector<std::vector<int32_t>> prompts = {Prompt(3, c.vocab_size, 1), Prompt(40, c.vocab_size, 2),
                                               Prompt(17, c.vocab_size, 3)};
  auto batch = GenerateBatch(*backend, *pool, prompts, Opts(5));
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto one = Generate(*backend, *pool, prompts[i], Opts(5));
    ASSERT_TRUE(one.ok());
    EXPECT_EQ((*batch)[i].tokens, one->tokens) << "request " << i;
  }
  EXPECT_EQ(pool->allocator().free_count(), 64);
}

TEST(Checkpoint, HfDirectoryGeneratesSameTokensAsDummy) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("kvstream_ck_" + std::to_string(getpid()));
  fs::remove_all(dir);
  for (DType dt : {DType::kBF16, DType::kF32, DType::kF16}) {
    SCOPED_TRACE(std::string(DTypeName(dt)));
    ModelSpec spec;
    spec.model = "tiny";
    spec.seed = 42;
    spec.weight_dtype = dt;
    spec.kv_dtype = DType::kF16;
    auto dummy_w = OpenWeights(spec).value();
    const std::string ck = (dir / std::string(DTypeName(dt))).string();
    ASSERT_TRUE(WriteHfCheckpoint(*dummy_w, dt, ck).ok());
    ModelSpec from_ck = spec;
    from_ck.model = ck;
    auto a = CreateCpuBackend(spec, BackendOptions{});
    auto b = CreateCpuBackend(from_ck, BackendOptions{});
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    auto pa = (*a)->CreatePool(16, 16).value();
    auto pb = (*b)->CreatePool(16, 16).value();
    const auto prompt = Prompt(12, 512, 77);
    auto ga = Generate(**a, *pa, prompt, Opts(8));
    auto gb = Generate(**b, *pb, prompt, Opts(8));
    ASSERT_TRUE(ga.ok() && gb.ok());
    EXPECT_EQ(ga->tokens, gb->tokens);
    EXPECT_NE((*a)->config().hash(), (*b)->config().hash());  // checkpoint identity differs
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvstream::model
