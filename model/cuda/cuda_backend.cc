#include "model/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "common/cuda_vmm.h"
#include "common/log.h"
#include "kernels/kv_write.h"
#include "kernels/layer_ops.h"
#include "kernels/paged_attention.h"
#include "kernels/prefill_attention.h"
#include "model/cuda/cuda_sampler.h"
#include "model/cuda/device_buffer.h"
#include "model/rope.h"
#include "model/weights.h"

namespace kvstream::model {
namespace {

#define KV_CUDA(expr) KV_RETURN_IF_ERROR(CudaStatus((expr), #expr))

Status CublasStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return OkStatus();
  return Internal(std::string(what) + ": cuBLAS status " + std::to_string(int(s)));
}

cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF32: return CUDA_R_32F;
  }
  return CUDA_R_32F;
}

// The KV pool: shareable device memory (common/cuda_vmm.h) where the driver can make it, so that
// cuda_ipc hands it to a peer only as a descriptor; cudaMalloc otherwise (cuda_ipc then refuses
// it as a write target; the other backends take it).
class DevicePoolMemory final : public PoolMemory {
 public:
  DevicePoolMemory(std::unique_ptr<cuda_vmm::ShareableDeviceMemory> vmm, size_t n)
      : vmm_(std::move(vmm)), ptr_(vmm_->data()), size_(n), device_(vmm_->device()) {}
  DevicePoolMemory(void* p, size_t n, int device) : ptr_(p), size_(n), device_(device) {}
  ~DevicePoolMemory() override {
    if (vmm_) return;  // vmm_'s destructor unmaps it
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(device_);
    cudaFree(ptr_);
    cudaSetDevice(prev);
  }
  void* data() const override { return ptr_; }
  size_t size() const override { return size_; }
  bool on_device() const override { return true; }
  int device() const override { return device_; }

 private:
  std::unique_ptr<cuda_vmm::ShareableDeviceMemory> vmm_;
  void* ptr_;
  size_t size_;
  int device_;
};

struct LayerWeights {
  const void* input_norm = nullptr;
  const void* qkv = nullptr;       // [(heads + 2 kv_heads) * head_dim][hidden]: q, k, v rows
  const void* qkv_bias = nullptr;  // [(heads + 2 kv_heads) * head_dim] or null
  const void* o = nullptr;         // [hidden][heads * head_dim]
  const void* post_norm = nullptr;
  const void* gate_up = nullptr;   // [2 * inter][hidden]: gate rows, then up rows
  const void* down = nullptr;      // [hidden][inter]
};

size_t AlignUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

class CudaBackend final : public ModelBackend {
 public:
  CudaBackend(ModelConfig config, int device)
      : config_(std::move(config)), device_(device), rope_freqs_(RopeFrequencies(config_, 0)) {
    name_ = "cuda:" + std::to_string(device_);
  }

  ~CudaBackend() override {
    cudaSetDevice(device_);
    if (stream_) cudaStreamSynchronize(stream_);
    if (cublas_) cublasDestroy(cublas_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  Status Init(const WeightSource& src) {
    KV_CUDA(cudaSetDevice(device_));
    int least = 0, greatest = 0;
    KV_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    KV_CUDA(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    KV_RETURN_IF_ERROR(CublasStatus(cublasCreate(&cublas_), "cublasCreate"));
    KV_RETURN_IF_ERROR(CublasStatus(cublasSetStream(cublas_, stream_), "cublasSetStream"));
    KV_RETURN_IF_ERROR(CublasStatus(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH),
                                    "cublasSetMathMode"));
    KV_RETURN_IF_ERROR(LoadWeights(src));
    return OkStatus();
  }

  std::string name() const override { return name_; }
  const ModelConfig& config() const override { return config_; }

  Result<std::unique_ptr<KvPool>> CreatePool(int num_blocks, int block_size) override {
    if (num_blocks <= 0 || block_size <= 0) {
      return InvalidArgument("CreatePool: num_blocks and block_size must be positive");
    }
    const KvLayout layout = kv_layout(block_size);
    KV_ASSIGN_OR_RETURN(auto mem, AllocateDevicePoolMemory(layout.pool_bytes(num_blocks), device_));
    return KvPool::Create(layout, num_blocks, std::move(mem));
  }

  Status Forward(KvPool& pool, std::span<const SeqInput> batch, LayerHooks* hooks,
                 const ForwardOptions& options, ForwardOutput* out) override;

  // A 16-token prefill then a 1-token decode on a scratch pool. CUDA loads kernels (ours and
  // cuBLAS's) on their first launch; seen on an H200: the first prefill and the first decode
  // step of a process each took ~30-80 ms longer than later ones. Warming up at load keeps
  // that out of the first request's TTFT.
  Status Warmup();

 private:
  Status LoadWeights(const WeightSource& src);
  Status Validate(KvPool& pool, std::span<const SeqInput> batch) const;
  Status Reserve(int num_tokens, int num_seqs, int max_blocks, const KvPool& pool);
  Status Run(KvPool& pool, std::span<const SeqInput> batch, LayerHooks* hooks,
             const ForwardOptions& options, ForwardOutput* out);
  // y[t][n] = sum_k x[t][k] * w[n][k] (+ y[t][n] when accumulate): x, w in weight_dtype.
  Status Gemm(float* y, const void* x, const void* w, int tokens, int n, int k, bool accumulate);

  ModelConfig config_;
  int device_;
  RopeFreqs rope_freqs_;  // of every forward but dynamic NTK's past its threshold
  std::string name_;
  std::mutex forward_mu_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;

  DeviceBuffer weights_;
  const void* embed_ = nullptr;
  const void* final_norm_ = nullptr;
  const void* lm_head_ = nullptr;
  std::vector<LayerWeights> layers_;

  // Per-forward work buffers (grown, never shrunk).
  int cap_tokens_ = 0, cap_seqs_ = 0, cap_blocks_ = 0;
  DeviceBuffer x_, xn_, qkv_, q_, attn_, gate_up_, act_, rope_, last_, last_n_, logits_,
      tokens_out_, meta_, decode_ws_;
  PinnedBuffer meta_host_, tokens_host_;
  CudaSampler sampler_;  // non-greedy steps (model/cuda/cuda_sampler.h)
};

Result<std::unique_ptr<PoolMemory>> AllocateDevicePoolMemoryImpl(size_t bytes, int device) {
  if (bytes == 0) return InvalidArgument("device pool of 0 bytes");
  KV_CUDA(cudaSetDevice(device));
  std::unique_ptr<DevicePoolMemory> pool;
  if (Status ok = cuda_vmm::Supported(device); ok.ok()) {
    KV_ASSIGN_OR_RETURN(auto vmm, cuda_vmm::ShareableDeviceMemory::Allocate(device, bytes));
    pool = std::make_unique<DevicePoolMemory>(std::move(vmm), bytes);
  } else {
    KV_LOG_WARN << "KV pool on device " << device << " made with cudaMalloc (" << ok.ToString()
                << "): the cuda_ipc transport cannot share it";
    void* p = nullptr;
    KV_CUDA(cudaMalloc(&p, bytes));
    pool = std::make_unique<DevicePoolMemory>(p, bytes, device);
  }
  cudaError_t e = cudaMemset(pool->data(), 0, bytes);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return CudaStatus(e, "zero-filling the KV pool");
  return std::unique_ptr<PoolMemory>(std::move(pool));
}

Status CudaBackend::LoadWeights(const WeightSource& src) {
  const ModelConfig& c = config_;
  const DType wd = c.weight_dtype;
  const size_t es = DTypeSize(wd);
  const std::vector<TensorSpec>& tensors = src.tensors();
  // Partners are packed right after the tensor before them (ModelTensors' order: q, k, v;
  // q/k/v bias; gate, up) so that each group is one GEMM operand; every other tensor starts
  // 256-byte aligned.
  auto follows_partner = [](TensorRole r) {
    return r == TensorRole::kKProj || r == TensorRole::kVProj || r == TensorRole::kKBias ||
           r == TensorRole::kVBias || r == TensorRole::kUpProj;
  };
  std::vector<size_t> offsets(tensors.size());
  size_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!follows_partner(tensors[i].role)) total = AlignUp(total, 256);
    offsets[i] = total;
    total += size_t(tensors[i].numel()) * es;
  }
  KV_RETURN_IF_ERROR(weights_.Reserve(std::max<size_t>(total, 256)));
  std::byte* base = weights_.as<std::byte>();

  layers_.assign(c.num_layers, LayerWeights{});
  std::map<std::pair<int, TensorRole>, const std::byte*> where;
  for (size_t i = 0; i < tensors.size(); ++i) {
    where[{tensors[i].layer, tensors[i].role}] = base + offsets[i];
  }
  auto get = [&](int layer, TensorRole role) -> const std::byte* {
    auto it = where.find({layer, role});
    return it == where.end() ? nullptr : it->second;
  };

  // Fill: on the GPU for dummy weights; through pinned staging for checkpoints.
  if (src.is_dummy()) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      const TensorSpec& t = tensors[i];
      KV_CUDA(kernels::DummyFill(base + offsets[i], wd, size_t(t.numel()), c.seed, t.dummy_id, 0,
                                 t.dummy_scale, t.dummy_offset, stream_));
    }
  } else {
    size_t largest = 0;
    for (const TensorSpec& t : tensors) largest = std::max(largest, size_t(t.numel()) * es);
    PinnedBuffer staging;
    KV_RETURN_IF_ERROR(staging.Reserve(std::max<size_t>(largest, 1)));
    for (size_t i = 0; i < tensors.size(); ++i) {
      const TensorSpec& t = tensors[i];
      KV_RETURN_IF_ERROR(src.Read(t, wd, staging.as<void>()));
      KV_CUDA(cudaMemcpyAsync(base + offsets[i], staging.as<void>(), size_t(t.numel()) * es,
                              cudaMemcpyHostToDevice, stream_));
      // The staging buffer is reused by the next tensor.
      KV_CUDA(cudaStreamSynchronize(stream_));
    }
  }
  KV_CUDA(cudaStreamSynchronize(stream_));

  embed_ = get(-1, TensorRole::kEmbed);
  final_norm_ = get(-1, TensorRole::kFinalNorm);
  lm_head_ = c.tie_word_embeddings ? embed_ : get(-1, TensorRole::kLmHead);
  if (!embed_ || !final_norm_ || !lm_head_) {
    return Internal("model tensors lack the embedding, final norm or LM head");
  }
  const size_t q_bytes = size_t(c.num_heads) * c.head_dim * es;
  const size_t kv_bytes = size_t(c.num_kv_heads) * c.head_dim * es;
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights& w = layers_[l];
    w.input_norm = get(l, TensorRole::kInputNorm);
    w.qkv = get(l, TensorRole::kQProj);
    w.o = get(l, TensorRole::kOProj);
    w.post_norm = get(l, TensorRole::kPostAttnNorm);
    w.gate_up = get(l, TensorRole::kGateProj);
    w.down = get(l, TensorRole::kDownProj);
    const std::byte* k = get(l, TensorRole::kKProj);
    const std::byte* v = get(l, TensorRole::kVProj);
    const std::byte* up = get(l, TensorRole::kUpProj);
    if (!w.input_norm || !w.qkv || !w.o || !w.post_norm || !w.gate_up || !w.down || !k || !v ||
        !up) {
      return Internal("layer " + std::to_string(l) + " lacks a tensor");
    }
    // The fused operands must really be contiguous.
    const std::byte* q = static_cast<const std::byte*>(w.qkv);
    if (k != q + q_bytes * c.hidden_size || v != k + kv_bytes * c.hidden_size ||
        up != static_cast<const std::byte*>(w.gate_up) + size_t(c.intermediate_size) * c.hidden_size * es) {
      return Internal("layer " + std::to_string(l) + ": fused weight packing broken");
    }
    if (c.qkv_bias) {
      const std::byte* qb = get(l, TensorRole::kQBias);
      const std::byte* kb = get(l, TensorRole::kKBias);
      const std::byte* vb = get(l, TensorRole::kVBias);
      if (!qb || kb != qb + q_bytes || vb != kb + kv_bytes) {
        return Internal("layer " + std::to_string(l) + ": q/k/v bias missing or not packed");
      }
      w.qkv_bias = qb;
    }
  }
  KV_LOG_INFO << "cuda backend " << name_ << ": " << c.name << ", " << c.num_layers
              << " layers, " << double(total) / (1 << 30) << " GiB of weights ("
              << DTypeName(wd) << (src.is_dummy() ? ", dummy, generated on the GPU" : "") << ")";
  return OkStatus();
}

Status CudaBackend::Warmup() {
  const int bs = 16;
  const int n = std::min(16, config_.max_position - 1);
  if (n < 1) return OkStatus();
  KV_ASSIGN_OR_RETURN(std::unique_ptr<KvPool> pool, CreatePool(BlocksForTokens(n + 1, bs), bs));
  std::vector<int32_t> tokens(n), table(BlocksForTokens(n + 1, bs));
  for (int i = 0; i < n; ++i) tokens[i] = i % config_.vocab_size;
  std::iota(table.begin(), table.end(), 0);
  SeqInput in;
  in.tokens = tokens;
  in.block_table = table;
  ForwardOutput out;
  KV_RETURN_IF_ERROR(Forward(*pool, {&in, 1}, nullptr, ForwardOptions{}, &out));
  in.tokens = std::span<const int32_t>(tokens.data(), 1);
  in.start_pos = n;
  return Forward(*pool, {&in, 1}, nullptr, ForwardOptions{}, &out);
}

Status CudaBackend::Validate(KvPool& pool, std::span<const SeqInput> batch) const {
  const ModelConfig& c = config_;
  if (batch.empty()) return InvalidArgument("Forward: empty batch");
  const KvLayout& layout = pool.layout();
  if (!(layout == kv_layout(layout.block_size))) {
    return InvalidArgument("Forward: the pool's layout does not match the model");
  }
  if (!pool.memory().on_device() || pool.memory().device() != device_) {
    return InvalidArgument("Forward: the pool is not in this GPU's memory (" + name_ + ")");
  }
  for (size_t s = 0; s < batch.size(); ++s) {
    const SeqInput& in = batch[s];
    const std::string which = "Forward: sequence " + std::to_string(s) + ": ";
    if (in.tokens.empty()) return InvalidArgument(which + "no new tokens");
    if (in.start_pos < 0) return InvalidArgument(which + "negative start_pos");
    const int64_t end = int64_t(in.start_pos) + int64_t(in.tokens.size());
    if (end > c.max_position) {
      return InvalidArgument(which + "position " + std::to_string(end - 1) +
                             " is past max_position " + std::to_string(c.max_position));
    }
    const int need = BlocksForTokens(int(end), layout.block_size);
    if (int64_t(in.block_table.size()) < need) {
      return InvalidArgument(which + "block table has " + std::to_string(in.block_table.size()) +
                             " blocks, " + std::to_string(need) + " needed");
    }
    for (int b = 0; b < need; ++b) {
      if (in.block_table[b] < 0 || in.block_table[b] >= pool.num_blocks()) {
        return InvalidArgument(which + "block id " + std::to_string(in.block_table[b]) +
                               " out of range");
      }
    }
    for (int32_t t : in.tokens) {
      if (t < 0 || t >= c.vocab_size) {
        return InvalidArgument(which + "token id " + std::to_string(t) + " out of range [0, " +
                               std::to_string(c.vocab_size) + ")");
      }
    }
  }
  return OkStatus();
}

// Metadata layout (int32, one upload per forward):
//   tokens[T] positions[T] slots[T] iota[T] q_start[B+1] start_pos[B] ctx_lens[B] last[B]
//   block_tables[B * max_blocks] rope_rows[T]
//   then, 8-byte aligned, rope frequencies: double[rows][head_dim/2] (RopeTable's inv_freq).
struct MetaOffsets {
  size_t tokens, positions, slots, iota, q_start, start_pos, ctx_lens, last, tables, rope_rows,
      freqs, total;
  MetaOffsets(int T, int B, int max_blocks, int rope_rows_n, int half) {
    size_t o = 0;
    tokens = o; o += T;
    positions = o; o += T;
    slots = o; o += T;
    iota = o; o += T;
    q_start = o; o += B + 1;
    start_pos = o; o += B;
    ctx_lens = o; o += B;
    last = o; o += B;
    tables = o; o += size_t(B) * max_blocks;
    rope_rows = o; o += T;
    freqs = o + (o & 1); o = freqs + 2 * size_t(rope_rows_n) * half;
    total = o;
  }
};

Status CudaBackend::Reserve(int T, int B, int max_blocks, const KvPool& pool) {
  const ModelConfig& c = config_;
  if (T <= cap_tokens_ && B <= cap_seqs_ && max_blocks <= cap_blocks_) return OkStatus();
  // Old buffers may be freed only once no queued work uses them.
  KV_CUDA(cudaStreamSynchronize(stream_));
  T = std::max(T, cap_tokens_);
  B = std::max(B, cap_seqs_);
  max_blocks = std::max(max_blocks, cap_blocks_);
  const size_t ws = DTypeSize(c.weight_dtype), ks = DTypeSize(c.kv_dtype);
  const size_t qkv_w = size_t(c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
  const size_t q_w = size_t(c.num_heads) * c.head_dim;
  const size_t in_w = std::max<size_t>(c.hidden_size, q_w);  // norm output or converted attn
  KV_RETURN_IF_ERROR(x_.Reserve(size_t(T) * c.hidden_size * 4));
  KV_RETURN_IF_ERROR(xn_.Reserve(size_t(T) * in_w * ws));
  KV_RETURN_IF_ERROR(qkv_.Reserve(size_t(T) * qkv_w * 4));
  KV_RETURN_IF_ERROR(q_.Reserve(size_t(T) * q_w * ks));
  KV_RETURN_IF_ERROR(attn_.Reserve(size_t(T) * q_w * ks));
  KV_RETURN_IF_ERROR(gate_up_.Reserve(size_t(T) * 2 * c.intermediate_size * 4));
  KV_RETURN_IF_ERROR(act_.Reserve(size_t(T) * c.intermediate_size * ws));
  KV_RETURN_IF_ERROR(rope_.Reserve(size_t(T) * c.head_dim * 4));
  KV_RETURN_IF_ERROR(last_.Reserve(size_t(B) * c.hidden_size * 4));
  KV_RETURN_IF_ERROR(last_n_.Reserve(size_t(B) * c.hidden_size * ws));
  KV_RETURN_IF_ERROR(logits_.Reserve(size_t(B) * c.vocab_size * 4));
  KV_RETURN_IF_ERROR(tokens_out_.Reserve(size_t(B) * 4));
  const MetaOffsets mo(T, B, max_blocks, B + 1, c.head_dim / 2);
  KV_RETURN_IF_ERROR(meta_.Reserve(mo.total * 4));
  KV_RETURN_IF_ERROR(meta_host_.Reserve(mo.total * 4));
  KV_RETURN_IF_ERROR(tokens_host_.Reserve(size_t(B) * 4));
  cap_tokens_ = T;
  cap_seqs_ = B;
  cap_blocks_ = max_blocks;
  return OkStatus();
}

Status CudaBackend::Gemm(float* y, const void* x, const void* w, int tokens, int n, int k,
                         bool accumulate) {
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  const cudaDataType_t t = CudaType(config_.weight_dtype);
  // Row-major y[tokens][n] = x[tokens][k] * w[n][k]^T is, in cuBLAS's column-major terms,
  // y^T (n x tokens) = w (n x k, stored as k x n: op T) * x^T (k x tokens).
  return CublasStatus(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, n, tokens, k, &alpha, w, t,
                                   k, x, t, k, &beta, y, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT),
                      "cublasGemmEx");
}

Status CudaBackend::Forward(KvPool& pool, std::span<const SeqInput> batch, LayerHooks* hooks,
                            const ForwardOptions& options, ForwardOutput* out) {
  if (!out) return InvalidArgument("Forward: null output");
  // The work buffers are shared: concurrent calls run one after the other.
  std::lock_guard<std::mutex> lock(forward_mu_);
  KV_CUDA(cudaSetDevice(device_));
  KV_RETURN_IF_ERROR(Validate(pool, batch));
  Status st = Run(pool, batch, hooks, options, out);
  if (!st.ok()) {
    // Nothing queued may outlive the call: the staging buffers are rewritten by the next one.
    cudaStreamSynchronize(stream_);
  }
  return st;
}

Status CudaBackend::Run(KvPool& pool, std::span<const SeqInput> batch, LayerHooks* hooks,
                        const ForwardOptions& options, ForwardOutput* out) {
  const ModelConfig& c = config_;
  const KvLayout& layout = pool.layout();
  const int bs = layout.block_size;
  const int B = int(batch.size());
  int T = 0, max_blocks = 1, max_new = 0, max_ctx = 0;
  bool all_single = true;
  for (const SeqInput& in : batch) {
    const int n = int(in.tokens.size());
    T += n;
    max_new = std::max(max_new, n);
    max_ctx = std::max(max_ctx, in.start_pos + n);
    max_blocks = std::max(max_blocks, BlocksForTokens(in.start_pos + n, bs));
    all_single = all_single && n == 1;
  }
  KV_RETURN_IF_ERROR(Reserve(T, B, max_blocks, pool));

  // ---- metadata: built on the host, one upload ----
  // Rope frequencies: row 0 for every sequence but those whose dynamic NTK frequencies depend
  // on their length in this forward (one row each).
  std::vector<int> rope_row(B, 0);
  std::vector<RopeFreqs> rows = {rope_freqs_};
  for (int s = 0; s < B; ++s) {
    const int64_t end = int64_t(batch[s].start_pos) + int64_t(batch[s].tokens.size());
    if (RopeDependsOnLength(c, end)) {
      rope_row[s] = int(rows.size());
      rows.push_back(RopeFrequencies(c, end));
    }
  }
  const int half = c.head_dim / 2;
  const MetaOffsets mo(T, B, max_blocks, int(rows.size()), half);
  int32_t* h = meta_host_.as<int32_t>();
  for (size_t r = 0; r < rows.size(); ++r) {
    std::memcpy(h + mo.freqs + 2 * r * half, rows[r].inv_freq.data(), sizeof(double) * half);
  }
  int t = 0;
  for (int s = 0; s < B; ++s) {
    const SeqInput& in = batch[s];
    const int n = int(in.tokens.size());
    h[mo.q_start + s] = t;
    h[mo.start_pos + s] = in.start_pos;
    h[mo.ctx_lens + s] = in.start_pos + n;
    h[mo.last + s] = t + n - 1;
    const int need = BlocksForTokens(in.start_pos + n, bs);
    for (int b = 0; b < max_blocks; ++b) {
      h[mo.tables + size_t(s) * max_blocks + b] = b < need ? in.block_table[b] : 0;
    }
    for (int i = 0; i < n; ++i, ++t) {
      const int pos = in.start_pos + i;
      h[mo.tokens + t] = in.tokens[i];
      h[mo.positions + t] = pos;
      h[mo.slots + t] = in.block_table[pos / bs] * bs + pos % bs;
      h[mo.iota + t] = t;
      h[mo.rope_rows + t] = rope_row[s];
    }
  }
  h[mo.q_start + B] = T;
  int32_t* meta = meta_.as<int32_t>();
  // Uploaded by the SMs from the page-locked host copy, not the copy engine: a KV tier's
  // prefetch on another stream keeps the H2D engine busy, and a copy queued behind it would
  // hold up this whole forward (docs/kv_tiers.md, "The GPU path").
  int32_t* h_mapped = nullptr;
  KV_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&h_mapped), h, 0));
  KV_CUDA(kernels::CopyWords(meta, h_mapped, mo.total, stream_));
  const int32_t* d_tokens = meta + mo.tokens;
  const int32_t* d_positions = meta + mo.positions;
  const int32_t* d_slots = meta + mo.slots;
  const int32_t* d_iota = meta + mo.iota;
  const int32_t* d_q_start = meta + mo.q_start;
  const int32_t* d_start_pos = meta + mo.start_pos;
  const int32_t* d_ctx_lens = meta + mo.ctx_lens;
  const int32_t* d_last = meta + mo.last;
  const int32_t* d_tables = meta + mo.tables;

  const DType wd = c.weight_dtype, kd = c.kv_dtype;
  const int H = c.hidden_size, hd = c.head_dim, nh = c.num_heads, nkv = c.num_kv_heads;
  const int I = c.intermediate_size;
  const int qkv_w = (nh + 2 * nkv) * hd;
  const int q_w = nh * hd;
  const float scale = 1.f / std::sqrt(float(hd));
  float* x = x_.as<float>();
  float* qkv = qkv_.as<float>();
  float* gate_up = gate_up_.as<float>();
  float* rope = rope_.as<float>();

  KV_CUDA(kernels::EmbeddingGather(x, embed_, wd, d_tokens, T, c.vocab_size, H, stream_));
  KV_CUDA(kernels::RopeTable(rope, d_positions, meta + mo.rope_rows,
                             reinterpret_cast<const double*>(meta + mo.freqs), T, hd,
                             rope_freqs_.scale, stream_));

  // Decode (one new token per sequence): the paged decode kernel where it supports the shape
  // (head 64/128/256, block 16/32); otherwise (e.g. the tiny preset's head 32) the prefill
  // kernel, which is exact for one token too.
  bool use_decode_kernel = false;
  kernels::PagedDecodeParams dp;
  if (all_single) {
    dp.out = attn_.get();
    dp.q = q_.get();
    dp.block_tables = d_tables;
    dp.context_lens = d_ctx_lens;
    dp.num_seqs = B;
    dp.num_heads = nh;
    dp.num_kv_heads = nkv;
    dp.head_dim = hd;
    dp.block_size = bs;
    dp.max_blocks_per_seq = max_blocks;
    dp.max_context_len = max_ctx;
    dp.host_context_lens = h + mo.ctx_lens;  // uneven batches: split the long ones finer
    dp.scale = scale;
    dp.dtype = kd;
    dp.kv_layer = pool.layer_base(0);
    dp.num_blocks = int(pool.num_blocks());  // bounds the kernel's early L2 prefetch
    if (kernels::PagedDecodeSupported(dp)) {
      use_decode_kernel = true;
      const size_t ws = kernels::PagedDecodeWorkspaceBytes(dp);
      if (ws > decode_ws_.size()) {
        KV_CUDA(cudaStreamSynchronize(stream_));
        KV_RETURN_IF_ERROR(decode_ws_.Reserve(ws));
        // The launcher's contract: zero once after allocating (fused-combine counters).
        KV_CUDA(cudaMemsetAsync(decode_ws_.get(), 0, decode_ws_.size(), stream_));
      }
      dp.workspace = ws ? decode_ws_.get() : nullptr;
      dp.workspace_bytes = ws ? decode_ws_.size() : 0;
    }
  }

  kernels::PrefillAttentionParams pp;
  pp.out = attn_.get();
  pp.q = q_.get();
  pp.block_tables = d_tables;
  pp.q_start = d_q_start;
  pp.start_pos = d_start_pos;
  pp.num_seqs = B;
  pp.num_heads = nh;
  pp.num_kv_heads = nkv;
  pp.head_dim = hd;
  pp.block_size = bs;
  pp.max_blocks_per_seq = max_blocks;
  pp.max_q_len = max_new;
  pp.scale = scale;
  pp.dtype = kd;
  pp.kv_layer = pool.layer_base(0);
  if (!use_decode_kernel && !kernels::PrefillAttentionSupported(pp)) {
    return NotSupported("cuda backend: no attention kernel for head_dim " + std::to_string(hd) +
                        ", kv dtype " + std::string(DTypeName(kd)));
  }

  kernels::KvWriteParams kw;
  kw.src_row_stride = size_t(qkv_w);
  kw.slot_mapping = d_slots;
  kw.num_tokens = T;
  kw.num_kv_heads = nkv;
  kw.head_dim = hd;
  kw.block_size = bs;
  kw.num_blocks = pool.num_blocks();
  kw.dtype = kd;

  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = layers_[l];
    void* layer_kv = pool.layer_base(l);
    KV_CUDA(kernels::RmsNorm(xn_.get(), wd, x, H, w.input_norm, wd, T, H, c.rms_eps, stream_));
    KV_RETURN_IF_ERROR(Gemm(qkv, xn_.get(), w.qkv, T, qkv_w, H, false));
    KV_CUDA(kernels::BiasRotary(qkv, w.qkv_bias, wd, rope, T, nh, nkv, hd, stream_));
    KV_CUDA(kernels::GatherRows(q_.get(), kd, qkv, DType::kF32, qkv_w, d_iota, T, q_w, stream_));
    if (hooks) KV_RETURN_IF_ERROR(hooks->BeforeAttention(l, stream_));
    kw.kv_layer = layer_kv;
    kw.k = qkv + q_w;
    kw.v = qkv + q_w + nkv * hd;
    KV_CUDA(kernels::KvWrite(kw, stream_));
    // As on the CPU backend: the layer's KV is complete here, before attention and the MLP, so
    // a transfer of it overlaps the rest of the layer.
    if (hooks) KV_RETURN_IF_ERROR(hooks->AfterLayer(l, stream_));
    if (use_decode_kernel) {
      dp.kv_layer = layer_kv;
      KV_CUDA(kernels::PagedDecodeAttention(dp, stream_));
    } else {
      pp.kv_layer = layer_kv;
      KV_CUDA(kernels::PrefillAttention(pp, stream_));
    }
    const void* attn_in = attn_.get();
    if (kd != wd) {
      KV_CUDA(kernels::Convert(xn_.get(), wd, attn_.get(), kd, size_t(T) * q_w, stream_));
      attn_in = xn_.get();
    }
    KV_RETURN_IF_ERROR(Gemm(x, attn_in, w.o, T, H, q_w, /*accumulate=*/true));
    KV_CUDA(kernels::RmsNorm(xn_.get(), wd, x, H, w.post_norm, wd, T, H, c.rms_eps, stream_));
    KV_RETURN_IF_ERROR(Gemm(gate_up, xn_.get(), w.gate_up, T, 2 * I, H, false));
    KV_CUDA(kernels::SwiGlu(act_.get(), wd, gate_up, T, I, stream_));
    KV_RETURN_IF_ERROR(Gemm(x, act_.get(), w.down, T, H, I, /*accumulate=*/true));
  }

  out->next_tokens.clear();
  out->logits.clear();
  out->logprobs.clear();
  if (!options.sampling.empty() && options.sampling.size() != size_t(B))
    return InvalidArgument("Forward: sampling entries do not match the batch");
  if (options.skip_lm_head) {
    KV_CUDA(cudaStreamSynchronize(stream_));
    out->next_tokens.assign(B, -1);
    return OkStatus();
  }
  float* last = last_.as<float>();
  KV_CUDA(kernels::GatherRows(last, DType::kF32, x, DType::kF32, H, d_last, B, H, stream_));
  KV_CUDA(kernels::RmsNorm(last_n_.get(), wd, last, H, final_norm_, wd, B, H, c.rms_eps,
                           stream_));
  float* logits = logits_.as<float>();
  KV_RETURN_IF_ERROR(Gemm(logits, last_n_.get(), lm_head_, B, c.vocab_size, H, false));
  int32_t* d_next = tokens_out_.as<int32_t>();
  int32_t* h_next = tokens_host_.as<int32_t>();
  const bool sample = NeedsSampling(options.sampling);
  if (sample) {
    KV_RETURN_IF_ERROR(sampler_.Enqueue(logits, B, c.vocab_size, options.sampling, d_next, h_next,
                                        stream_));
  } else {
    KV_CUDA(kernels::ArgmaxRows(d_next, logits, B, c.vocab_size, stream_));
    KV_CUDA(cudaMemcpyAsync(h_next, d_next, size_t(B) * 4, cudaMemcpyDeviceToHost, stream_));
  }
  if (options.want_logits) {
    out->logits.resize(size_t(B) * c.vocab_size);
    KV_CUDA(cudaMemcpyAsync(out->logits.data(), logits, out->logits.size() * 4,
                            cudaMemcpyDeviceToHost, stream_));
  }
  KV_CUDA(cudaStreamSynchronize(stream_));
  out->next_tokens.assign(h_next, h_next + B);
  if (sample) sampler_.Collect(options.sampling, &out->logprobs);
  return OkStatus();
}

}  // namespace

Result<std::unique_ptr<PoolMemory>> AllocateDevicePoolMemory(size_t bytes, int device) {
  return AllocateDevicePoolMemoryImpl(bytes, device);
}

Result<std::unique_ptr<ModelBackend>> CreateCudaBackend(const ModelSpec& spec,
                                                        const BackendOptions& options) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    return Unavailable(std::string("cuda backend: no usable GPU (") +
                       (e == cudaSuccess ? "0 devices" : cudaGetErrorString(e)) + ")");
  }
  if (options.device < 0 || options.device >= count) {
    return Unavailable("cuda backend: device " + std::to_string(options.device) +
                       " out of range (" + std::to_string(count) + " devices)");
  }
  KV_ASSIGN_OR_RETURN(std::unique_ptr<WeightSource> src, OpenWeights(spec));
  const ModelConfig& c = src->config();
  if (c.weight_dtype != DType::kF16 && c.weight_dtype != DType::kBF16) {
    return NotSupported("cuda backend: weight dtype " + std::string(DTypeName(c.weight_dtype)) +
                        " (f16 or bf16 only)");
  }
  if (c.kv_dtype != DType::kF16 && c.kv_dtype != DType::kBF16) {
    return NotSupported("cuda backend: kv dtype " + std::string(DTypeName(c.kv_dtype)) +
                        " (f16 or bf16 only)");
  }
  auto backend = std::make_unique<CudaBackend>(c, options.device);
  KV_RETURN_IF_ERROR(backend->Init(*src).WithContext("cuda backend"));
  if (Status w = backend->Warmup(); !w.ok()) {
    // Not fatal: a broken device shows up again, as an error, in the first Forward.
    KV_LOG_WARN << "cuda backend: warm-up forward failed: " << w.ToString();
  }
  return std::unique_ptr<ModelBackend>(std::move(backend));
}

}  // namespace kvstream::model
