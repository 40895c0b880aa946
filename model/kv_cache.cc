#include "model/kv_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_map>

namespace kvstream::model {

BlockAllocator::BlockAllocator(int num_blocks)
    : num_blocks_(std::max(num_blocks, 0)), refcount_(num_blocks_, 0) {
  free_.reserve(num_blocks_);
  // LIFO: the lowest ids come out first.
  for (int i = num_blocks_ - 1; i >= 0; --i) free_.push_back(i);
}

Result<std::vector<int32_t>> BlockAllocator::Allocate(int n) {
  if (n < 0) return InvalidArgument("Allocate: negative block count " + std::to_string(n));
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<size_t>(n) > free_.size())
    return ResourceExhausted("KV pool exhausted: need " + std::to_string(n) + " blocks, " +
                             std::to_string(free_.size()) + " of " + std::to_string(num_blocks_) +
                             " free");
  std::vector<int32_t> out(free_.end() - n, free_.end());
  std::reverse(out.begin(), out.end());
  free_.resize(free_.size() - n);
  for (int32_t id : out) refcount_[id] = 1;
  return out;
}

Status BlockAllocator::Ref(const std::vector<int32_t>& ids) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int32_t id : ids) {
    if (id < 0 || id >= num_blocks_)
      return InvalidArgument("Ref: block id " + std::to_string(id) + " out of range [0, " +
                             std::to_string(num_blocks_) + ")");
    if (refcount_[id] == 0) return InvalidArgument("Ref: block " + std::to_string(id) + " is free");
  }
  for (int32_t id : ids) ++refcount_[id];
  return OkStatus();
}

Status BlockAllocator::Release(const std::vector<int32_t>& ids) {
  std::lock_guard<std::mutex> lock(mu_);
  // Validate the whole list first (a repeated id counts once per occurrence), so an error
  // changes nothing.
  std::unordered_map<int32_t, int32_t> count;
  for (int32_t id : ids) {
    if (id < 0 || id >= num_blocks_)
      return InvalidArgument("Release: block id " + std::to_string(id) + " out of range [0, " +
                             std::to_string(num_blocks_) + ")");
    if (++count[id] > refcount_[id])
      return InvalidArgument("Release: block " + std::to_string(id) + " is already free");
  }
  // Pushed in reverse, so a released run comes back out in the order it was handed out
  // (ascending): a request's blocks stay contiguous runs that transfers coalesce, also after
  // many allocate/release cycles (pushed in order, every other reuse came out descending).
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
    if (--refcount_[*it] == 0) free_.push_back(*it);
  }
  return OkStatus();
}

int BlockAllocator::free_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(free_.size());
}

int BlockAllocator::refcount(int32_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (id < 0 || id >= num_blocks_) return 0;
  return refcount_[id];
}

namespace {

class HostPoolMemory : public PoolMemory {
 public:
  HostPoolMemory(void* p, size_t size, size_t mapped) : p_(p), size_(size), mapped_(mapped) {}
  ~HostPoolMemory() override { munmap(p_, mapped_); }
  void* data() const override { return p_; }
  size_t size() const override { return size_; }
  bool on_device() const override { return false; }

 private:
  void* p_;
  size_t size_;
  size_t mapped_;
};

}  // namespace

Result<std::unique_ptr<PoolMemory>> AllocateHostPoolMemory(size_t bytes) {
  if (bytes == 0) return InvalidArgument("host pool memory of 0 bytes");
  const size_t page = 4096;
  size_t mapped = (bytes + page - 1) / page * page;
  // Anonymous mappings are page-aligned and zero-filled, and commit memory lazily.
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return ResourceExhausted("mmap of " + std::to_string(bytes) +
                             " bytes for the KV pool failed: " + std::strerror(errno));
  return std::unique_ptr<PoolMemory>(new HostPoolMemory(p, bytes, mapped));
}

KvPool::KvPool(const KvLayout& layout, int num_blocks, std::unique_ptr<PoolMemory> memory)
    : layout_(layout), num_blocks_(num_blocks), memory_(std::move(memory)), allocator_(num_blocks) {}

Result<std::unique_ptr<KvPool>> KvPool::Create(const KvLayout& layout, int num_blocks,
                                               std::unique_ptr<PoolMemory> memory) {
  if (layout.num_layers <= 0 || layout.num_kv_heads <= 0 || layout.head_dim <= 0 ||
      layout.block_size <= 0)
    return InvalidArgument("KV layout needs positive layers, kv heads, head_dim and block_size");
  if (num_blocks <= 0) return InvalidArgument("KV pool needs num_blocks > 0");
  if (!memory) return InvalidArgument("KV pool without memory");
  if (memory->size() < layout.pool_bytes(num_blocks))
    return InvalidArgument("KV pool memory holds " + std::to_string(memory->size()) +
                           " bytes, layout needs " +
                           std::to_string(layout.pool_bytes(num_blocks)));
  return std::make_unique<KvPool>(layout, num_blocks, std::move(memory));
}

Result<std::unique_ptr<KvPool>> CreateHostPool(const KvLayout& layout, int num_blocks) {
  if (num_blocks <= 0) return InvalidArgument("KV pool needs num_blocks > 0");
  size_t bytes = layout.pool_bytes(num_blocks);
  KV_ASSIGN_OR_RETURN(auto mem, AllocateHostPoolMemory(bytes));
  return KvPool::Create(layout, num_blocks, std::move(mem));
}

BlockLease& BlockLease::operator=(BlockLease&& o) noexcept {
  if (this != &o) {
    Reset();
    alloc_ = o.alloc_;
    ids_ = std::move(o.ids_);
    o.alloc_ = nullptr;
    o.ids_.clear();
  }
  return *this;
}

Status BlockLease::GrowToTokens(int n_tokens, int block_size) {
  if (!alloc_) return FailedPrecondition("BlockLease without an allocator");
  if (n_tokens < 0 || block_size <= 0)
    return InvalidArgument("GrowToTokens: bad token count or block size");
  int need = BlocksForTokens(n_tokens, block_size) - static_cast<int>(ids_.size());
  if (need <= 0) return OkStatus();
  KV_ASSIGN_OR_RETURN(auto more, alloc_->Allocate(need));
  ids_.insert(ids_.end(), more.begin(), more.end());
  return OkStatus();
}

void BlockLease::Reset() {
  if (alloc_ && !ids_.empty()) alloc_->Release(ids_).IgnoreError();
  ids_.clear();
}

}  // namespace kvstream::model
