#include "model/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include "model/rope.h"
#include "model/thread_pool.h"

namespace kvstream::model {

float ReferenceDot(const float* a, const float* b, int n) {
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[k + j] * b[k + j];
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; k < n; ++k) s += a[k] * b[k];
  return s;
}

void ReferenceDot4(const float* a, const float* const b[4], int n, float out[4]) {
  // Four independent dot products interleaved for instruction-level parallelism; each one
  // follows ReferenceDot's order exactly, so the results are bit-identical to it.
  float acc[4][8] = {};
  int k = 0;
  for (; k + 8 <= n; k += 8)
    for (int r = 0; r < 4; ++r)
      for (int j = 0; j < 8; ++j) acc[r][j] += a[k + j] * b[r][k + j];
  for (int r = 0; r < 4; ++r) {
    const float* c = acc[r];
    float s = ((c[0] + c[4]) + (c[1] + c[5])) + ((c[2] + c[6]) + (c[3] + c[7]));
    for (int i = k; i < n; ++i) s += a[i] * b[r][i];
    out[r] = s;
  }
}

namespace {

const float* F16Table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t i = 0; i < 65536; ++i) t[i] = F16ToF32(static_cast<uint16_t>(i));
    return t;
  }();
  return table.data();
}

// A weight matrix [rows, cols] in its storage dtype; rows widen to fp32 on use.
struct Mat {
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;
  std::vector<float> f;      // kF32
  std::vector<uint16_t> h;   // kF16 / kBF16

  // Returns row r as fp32: a pointer into f, or scratch (cols floats) filled from h.
  const float* Row(int64_t r, float* scratch) const {
    if (dtype == DType::kF32) return f.data() + r * cols;
    const uint16_t* src = h.data() + r * cols;
    if (dtype == DType::kF16) {
      const float* t = F16Table();
      for (int64_t k = 0; k < cols; ++k) scratch[k] = t[src[k]];
    } else {
      for (int64_t k = 0; k < cols; ++k) {
        uint32_t bits = uint32_t(src[k]) << 16;
        std::memcpy(&scratch[k], &bits, 4);
      }
    }
    return scratch;
  }
};

struct Layer {
  std::vector<float> in_norm, post_norm, q_bias, k_bias, v_bias;
  Mat q, k, v, o, gate, up, down;
};

class CpuBackend : public ModelBackend {
 public:
  CpuBackend(ModelConfig c, int threads)
      : config_(std::move(c)), pool_(threads), rope_(RopeFrequencies(config_, 0)) {}

  Status Load(const WeightSource& w) {
    layers_.resize(config_.num_layers);
    for (const TensorSpec& t : w.tensors()) {
      Layer* L = t.layer >= 0 ? &layers_[t.layer] : nullptr;
      switch (t.role) {
        case TensorRole::kEmbed: KV_RETURN_IF_ERROR(LoadMat(w, t, &embed_)); break;
        case TensorRole::kLmHead: KV_RETURN_IF_ERROR(LoadMat(w, t, &lm_head_)); break;
        case TensorRole::kFinalNorm: KV_RETURN_IF_ERROR(w.ReadF32(t, &final_norm_)); break;
        case TensorRole::kInputNorm: KV_RETURN_IF_ERROR(w.ReadF32(t, &L->in_norm)); break;
        case TensorRole::kPostAttnNorm: KV_RETURN_IF_ERROR(w.ReadF32(t, &L->post_norm)); break;
        case TensorRole::kQBias: KV_RETURN_IF_ERROR(w.ReadF32(t, &L->q_bias)); break;
        case TensorRole::kKBias: KV_RETURN_IF_ERROR(w.ReadF32(t, &L->k_bias)); break;
        case TensorRole::kVBias: KV_RETURN_IF_ERROR(w.ReadF32(t, &L->v_bias)); break;
        case TensorRole::kQProj: KV_RETURN_IF_ERROR(LoadMat(w, t, &L->q)); break;
        case TensorRole::kKProj: KV_RETURN_IF_ERROR(LoadMat(w, t, &L->k)); break;
        case TensorRole::kVProj: KV_RETURN_IF_ERROR(LoadMat(w, t, &L->v)); break;
        case TensorRole::kOProj: KV_RETURN_IF_ERROR(LoadMat(w, t, &L->o)); break;
        case TensorRole::kGateProj: KV_RETURN_IF_ERROR(LoadMat(w, t, &L->gate)); break;
        case TensorRole::kUpProj: KV_RETURN_IF_ERROR(LoadMat(w, t, &L->up)); break;
        case TensorRole::kDownProj: KV_RETURN_IF_ERROR(LoadMat(w, t, &L->down)); break;
      }
    }
    return OkStatus();
  }

  std::string name() const override { return "cpu"; }
  const ModelConfig& config() const override { return config_; }

  Result<std::unique_ptr<KvPool>> CreatePool(int num_blocks, int block_size) override {
    if (block_size <= 0) return InvalidArgument("block_size must be > 0");
    return CreateHostPool(kv_layout(block_size), num_blocks);
  }

  Status Forward(KvPool& pool, std::span<const SeqInput> batch, LayerHooks* hooks,
                 const ForwardOptions& options, ForwardOutput* out) override;

 private:
  Status LoadMat(const WeightSource& w, const TensorSpec& t, Mat* m) {
    m->dtype = config_.weight_dtype;
    m->rows = t.shape[0];
    m->cols = t.shape[1];
    if (m->dtype == DType::kF32) {
      m->f.resize(size_t(t.numel()));
      return w.Read(t, DType::kF32, m->f.data());
    }
    m->h.resize(size_t(t.numel()));
    return w.Read(t, m->dtype, m->h.data());
  }

  // y[t][r] = dot(x[t], W[r]) for t < T.
  void MatMul(const float* x, int64_t T, const Mat& W, float* y) {
    constexpr int64_t kGroup = 8;
    const int64_t groups = (W.rows + kGroup - 1) / kGroup;
    const int cols = static_cast<int>(W.cols);
    pool_.ParallelFor(groups, [&](int64_t gb, int64_t ge) {
      std::vector<float> scratch(size_t(kGroup * W.cols));
      const float* rows[kGroup];
      for (int64_t g = gb; g < ge; ++g) {
        const int64_t r0 = g * kGroup, r1 = std::min(W.rows, r0 + kGroup);
        for (int64_t r = r0; r < r1; ++r) rows[r - r0] = W.Row(r, scratch.data() + (r - r0) * W.cols);
        for (int64_t t = 0; t < T; ++t) {
          const float* xt = x + t * W.cols;
          float* yt = y + t * W.rows;
          int64_t r = r0;
          for (; r + 4 <= r1; r += 4) ReferenceDot4(xt, &rows[r - r0], cols, &yt[r]);
          for (; r < r1; ++r) yt[r] = ReferenceDot(xt, rows[r - r0], cols);
        }
      }
    });
  }

  void RmsNorm(const float* x, int64_t T, const std::vector<float>& w, float* y) {
    const int H = config_.hidden_size;
    const float eps = config_.rms_eps;
    pool_.ParallelFor(T, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const float* xt = x + t * H;
        float ms = ReferenceDot(xt, xt, H) / float(H);
        float inv = 1.0f / std::sqrt(ms + eps);
        for (int i = 0; i < H; ++i) y[t * H + i] = (xt[i] * inv) * w[i];
      }
    });
  }

  ModelConfig config_;
  ThreadPool pool_;
  RopeFreqs rope_;  // frequencies of every forward but dynamic NTK's past its threshold
  Mat embed_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<Layer> layers_;
};

Status CpuBackend::Forward(KvPool& kv, std::span<const SeqInput> batch, LayerHooks* hooks,
                           const ForwardOptions& options, ForwardOutput* out) {
  const ModelConfig& c = config_;
  const KvLayout& lay = kv.layout();
  if (batch.empty()) return InvalidArgument("Forward: empty batch");
  if (kv.memory().on_device()) return InvalidArgument("Forward: the CPU backend needs a host pool");
  if (lay.num_layers != c.num_layers || lay.num_kv_heads != c.num_kv_heads ||
      lay.head_dim != c.head_dim || lay.dtype != c.kv_dtype)
    return InvalidArgument("Forward: pool layout does not match the model (layers, kv heads, "
                           "head_dim or kv dtype)");
  const int bs = lay.block_size;
  const int H = c.hidden_size, QD = c.q_dim(), KVD = c.kv_dim(), M = c.intermediate_size,
            HD = c.head_dim, V = c.vocab_size, NH = c.num_heads, NKV = c.num_kv_heads,
            G = c.group_size();
  // Token t of the flattened batch: its sequence and absolute position.
  std::vector<int32_t> seq_of, pos_of, first_tok(batch.size());
  std::unordered_set<int32_t> written;
  for (size_t s = 0; s < batch.size(); ++s) {
    const SeqInput& in = batch[s];
    const std::string who = "Forward: sequence " + std::to_string(s) + ": ";
    if (in.tokens.empty()) return InvalidArgument(who + "no tokens");
    if (in.start_pos < 0) return InvalidArgument(who + "negative start_pos");
    const int64_t end = int64_t(in.start_pos) + int64_t(in.tokens.size());
    if (end > c.max_position)
      return InvalidArgument(who + "position " + std::to_string(end - 1) + " exceeds max_position " +
                             std::to_string(c.max_position));
    if (int64_t(in.block_table.size()) * bs < end)
      return InvalidArgument(who + "block table of " + std::to_string(in.block_table.size()) +
                             " blocks does not cover " + std::to_string(end) + " tokens");
    for (int64_t b = 0; b < (end + bs - 1) / bs; ++b)
      if (in.block_table[b] < 0 || in.block_table[b] >= kv.num_blocks())
        return InvalidArgument(who + "block id " + std::to_string(in.block_table[b]) +
                               " out of range");
    // A block written here must belong to this sequence alone and appear once in its table;
    // otherwise two positions would share a slot and corrupt each other silently.
    for (int64_t b = 0; b < (end + bs - 1) / bs; ++b) {
      const int32_t id = in.block_table[b];
      for (int64_t b2 = 0; b2 < b; ++b2)
        if (in.block_table[b2] == id)
          return InvalidArgument(who + "block " + std::to_string(id) + " appears twice in its table");
      if (b >= in.start_pos / bs && !written.insert(id).second)
        return InvalidArgument(who + "block " + std::to_string(id) +
                               " is written by two sequences of the batch");
    }
    for (int32_t tok : in.tokens)
      if (tok < 0 || tok >= V)
        return InvalidArgument(who + "token id " + std::to_string(tok) + " out of range [0, " +
                               std::to_string(V) + ")");
    first_tok[s] = static_cast<int32_t>(seq_of.size());
    for (size_t i = 0; i < in.tokens.size(); ++i) {
      seq_of.push_back(static_cast<int32_t>(s));
      pos_of.push_back(in.start_pos + static_cast<int32_t>(i));
    }
  }
  const int64_t T = static_cast<int64_t>(seq_of.size());
  auto tok_of = [&](int64_t t) { return batch[seq_of[t]].tokens[t - first_tok[seq_of[t]]]; };

  std::vector<float> x(size_t(T) * H), xn(size_t(T) * H), q(size_t(T) * QD), k(size_t(T) * KVD),
      v(size_t(T) * KVD), attn(size_t(T) * QD), tmp(size_t(T) * H), g(size_t(T) * M),
      u(size_t(T) * M);
  pool_.ParallelFor(T, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* row = embed_.Row(tok_of(t), x.data() + t * H);
      if (row != x.data() + t * H) std::memcpy(x.data() + t * H, row, sizeof(float) * H);
    }
  });
  // Rotation factors per token, from the frequencies of its sequence's extent in this forward.
  std::vector<RopeFreqs> seq_rope(batch.size());
  for (size_t s = 0; s < batch.size(); ++s) {
    const int64_t end = int64_t(batch[s].start_pos) + int64_t(batch[s].tokens.size());
    if (RopeDependsOnLength(c, end)) seq_rope[s] = RopeFrequencies(c, end);
  }
  std::vector<float> cosv(size_t(T) * (HD / 2)), sinv(size_t(T) * (HD / 2));
  pool_.ParallelFor(T, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const RopeFreqs& f = seq_rope[seq_of[t]].inv_freq.empty() ? rope_ : seq_rope[seq_of[t]];
      RopeCosSin(f, pos_of[t], &cosv[t * (HD / 2)], &sinv[t * (HD / 2)]);
    }
  });
  const size_t elem = lay.elem_bytes();
  // Element offset of (kv, head, slot) inside a block.
  auto kv_ptr = [&](int layer, int32_t block, int which, int head, int slot) {
    return kv.block_ptr(layer, block) + ((size_t(which) * NKV + head) * bs + slot) * HD * elem;
  };
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));

  for (int l = 0; l < c.num_layers; ++l) {
    const Layer& L = layers_[l];
    RmsNorm(x.data(), T, L.in_norm, xn.data());
    MatMul(xn.data(), T, L.q, q.data());
    MatMul(xn.data(), T, L.k, k.data());
    MatMul(xn.data(), T, L.v, v.data());
    pool_.ParallelFor(T, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        float* qt = q.data() + t * QD;
        float* kt = k.data() + t * KVD;
        float* vt = v.data() + t * KVD;
        if (c.qkv_bias) {
          for (int i = 0; i < QD; ++i) qt[i] += L.q_bias[i];
          for (int i = 0; i < KVD; ++i) kt[i] += L.k_bias[i];
          for (int i = 0; i < KVD; ++i) vt[i] += L.v_bias[i];
        }
        const float* cs = &cosv[t * (HD / 2)];
        const float* sn = &sinv[t * (HD / 2)];
        for (int h = 0; h < NH; ++h) RopeApply(qt + h * HD, HD, cs, sn);
        for (int h = 0; h < NKV; ++h) RopeApply(kt + h * HD, HD, cs, sn);
      }
    });
    if (hooks) KV_RETURN_IF_ERROR(hooks->BeforeAttention(l, nullptr));
    pool_.ParallelFor(T, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const SeqInput& in = batch[seq_of[t]];
        const int32_t block = in.block_table[pos_of[t] / bs];
        const int slot = pos_of[t] % bs;
        for (int h = 0; h < NKV; ++h) {
          std::byte* kd = kv_ptr(l, block, 0, h, slot);
          std::byte* vd = kv_ptr(l, block, 1, h, slot);
          for (int i = 0; i < HD; ++i) {
            StoreFromF32(kd, lay.dtype, i, k[t * KVD + h * HD + i]);
            StoreFromF32(vd, lay.dtype, i, v[t * KVD + h * HD + i]);
          }
        }
      }
    });
    if (hooks) KV_RETURN_IF_ERROR(hooks->AfterLayer(l, nullptr));
    // Attention, one sequence at a time: widen its context's K/V from the pool once, then
    // every (token, head) pair reads them.
    for (size_t s = 0; s < batch.size(); ++s) {
      const SeqInput& in = batch[s];
      const int ctx = in.start_pos + static_cast<int>(in.tokens.size());
      std::vector<float> kf(size_t(NKV) * ctx * HD), vf(size_t(NKV) * ctx * HD);
      pool_.ParallelFor(int64_t(NKV) * ctx, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const int h = static_cast<int>(i / ctx), p = static_cast<int>(i % ctx);
          const int32_t block = in.block_table[p / bs];
          const std::byte* ks = kv_ptr(l, block, 0, h, p % bs);
          const std::byte* vs = kv_ptr(l, block, 1, h, p % bs);
          for (int d = 0; d < HD; ++d) {
            kf[i * HD + d] = LoadAsF32(ks, lay.dtype, d);
            vf[i * HD + d] = LoadAsF32(vs, lay.dtype, d);
          }
        }
      });
      const int64_t n = static_cast<int64_t>(in.tokens.size());
      pool_.ParallelFor(n * NH, [&](int64_t b, int64_t e) {
        std::vector<float> w(static_cast<size_t>(ctx));
        std::vector<float> acc(static_cast<size_t>(HD));
        for (int64_t i = b; i < e; ++i) {
          const int64_t t = first_tok[s] + i / NH;
          const int h = static_cast<int>(i % NH), kvh = h / G;
          const int p = pos_of[t];
          const float* qh = q.data() + t * QD + h * HD;
          const float* kb = kf.data() + size_t(kvh) * ctx * HD;
          const float* vb = vf.data() + size_t(kvh) * ctx * HD;
          float mx = -INFINITY;
          for (int j = 0; j <= p; ++j) {
            w[j] = ReferenceDot(qh, kb + size_t(j) * HD, HD) * scale;
            mx = std::max(mx, w[j]);
          }
          float sum = 0.f;
          for (int j = 0; j <= p; ++j) {
            w[j] = std::exp(w[j] - mx);
            sum += w[j];
          }
          std::fill(acc.begin(), acc.end(), 0.f);
          for (int j = 0; j <= p; ++j) {
            const float* vj = vb + size_t(j) * HD;
            for (int d = 0; d < HD; ++d) acc[d] += w[j] * vj[d];
          }
          const float inv = 1.0f / sum;
          float* o = attn.data() + t * QD + h * HD;
          for (int d = 0; d < HD; ++d) o[d] = acc[d] * inv;
        }
      });
    }
    MatMul(attn.data(), T, L.o, tmp.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
    RmsNorm(x.data(), T, L.post_norm, xn.data());
    MatMul(xn.data(), T, L.gate, g.data());
    MatMul(xn.data(), T, L.up, u.data());
    pool_.ParallelFor(T, [&](int64_t b, int64_t e) {
      for (int64_t i = b * M; i < e * M; ++i) {
        const float gi = g[i];
        g[i] = (gi / (1.0f + std::exp(-gi))) * u[i];
      }
    });
    MatMul(g.data(), T, L.down, tmp.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
  }

  const int64_t B = static_cast<int64_t>(batch.size());
  out->next_tokens.assign(size_t(B), -1);
  out->logits.clear();
  out->logprobs.clear();
  if (options.skip_lm_head) return OkStatus();
  std::vector<float> last(size_t(B) * H), lastn(size_t(B) * H), logits(size_t(B) * V);
  for (int64_t s = 0; s < B; ++s) {
    const int64_t t = first_tok[s] + int64_t(batch[s].tokens.size()) - 1;
    std::memcpy(&last[s * H], &x[t * H], sizeof(float) * H);
  }
  RmsNorm(last.data(), B, final_norm_, lastn.data());
  MatMul(lastn.data(), B, c.tie_word_embeddings ? embed_ : lm_head_, logits.data());
  if (!options.sampling.empty() && options.sampling.size() != size_t(B))
    return InvalidArgument("Forward: " + std::to_string(options.sampling.size()) +
                           " sampling entries for " + std::to_string(B) + " sequences");
  SampleRows(logits.data(), int(B), int(V), options.sampling, &out->next_tokens, &out->logprobs);
  if (options.want_logits) out->logits = std::move(logits);
  return OkStatus();
}

}  // namespace

Result<std::unique_ptr<ModelBackend>> CreateCpuBackend(const WeightSource& weights,
                                                       int num_threads) {
  KV_RETURN_IF_ERROR(weights.config().Validate());
  auto b = std::make_unique<CpuBackend>(weights.config(), num_threads);
  KV_RETURN_IF_ERROR(b->Load(weights).WithContext("loading weights"));
  return std::unique_ptr<ModelBackend>(std::move(b));
}

Result<std::unique_ptr<ModelBackend>> CreateCpuBackend(const ModelSpec& spec,
                                                       const BackendOptions& options) {
  KV_ASSIGN_OR_RETURN(auto w, OpenWeights(spec));
  return CreateCpuBackend(*w, options.num_threads);
}

}  // namespace kvstream::model
