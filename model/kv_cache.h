// The paged KV cache: layout, block allocator, pools.
//
// Memory layout of a pool (one contiguous allocation, so a transport registers it once):
//
//   pool[layer][block][kv (0 = K, 1 = V)][kv_head][slot (0..block_size)][head_dim]
//
// so one block of one layer (K and V of every KV head) is one contiguous run of
// layout.block_bytes() bytes, and neighbouring block ids of one layer are neighbouring runs:
// a request's blocks coalesce into few transfers. One head's K tile of a block is
// block_size * head_dim * elem bytes (4 KiB at block 16, head 128, fp16): the unit the decode
// kernel prefetches into L2.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace kvstream::model {

struct KvLayout {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;
  DType dtype = DType::kF16;

  size_t elem_bytes() const { return DTypeSize(dtype); }
  // One head's K (or V) tile of one block.
  size_t tile_bytes() const { return size_t(block_size) * head_dim * elem_bytes(); }
  // K and V of every KV head, one block, one layer.
  size_t block_bytes() const { return 2 * size_t(num_kv_heads) * tile_bytes(); }
  size_t layer_bytes(size_t num_blocks) const { return num_blocks * block_bytes(); }
  size_t pool_bytes(size_t num_blocks) const { return num_layers * layer_bytes(num_blocks); }
  // Byte offset of (layer, block) inside a pool of num_blocks blocks.
  size_t block_offset(size_t num_blocks, int layer, int block) const {
    return size_t(layer) * layer_bytes(num_blocks) + size_t(block) * block_bytes();
  }
  bool operator==(const KvLayout&) const = default;
};

// Hands out block ids [0, num_blocks). Reference-counted: Allocate gives refcount 1,
// Ref adds one, Release drops one and returns the block to the free list at zero.
// A block is never handed out while its refcount is > 0. Thread-safe.
class BlockAllocator {
 public:
  explicit BlockAllocator(int num_blocks);
  // All-or-nothing: n blocks, or kResourceExhausted and nothing allocated.
  Result<std::vector<int32_t>> Allocate(int n);
  // kInvalidArgument (nothing changed) if any id is out of range or already free.
  Status Ref(const std::vector<int32_t>& ids);
  Status Release(const std::vector<int32_t>& ids);
  int num_blocks() const { return num_blocks_; }
  int free_count() const;
  int refcount(int32_t id) const;

 private:
  int num_blocks_;
  mutable std::mutex mu_;
  std::vector<int32_t> free_;      // LIFO free list
  std::vector<int32_t> refcount_;
};

// Backing memory of a pool: host (this file) or device (the CUDA backend). Freed by its
// destructor.
class PoolMemory {
 public:
  virtual ~PoolMemory() = default;
  virtual void* data() const = 0;
  virtual size_t size() const = 0;
  virtual bool on_device() const = 0;
  virtual int device() const { return -1; }
};

// Page-aligned, zero-filled host memory.
Result<std::unique_ptr<PoolMemory>> AllocateHostPoolMemory(size_t bytes);

// A pool of num_blocks blocks for every layer plus its allocator.
class KvPool {
 public:
  // The memory must hold layout.pool_bytes(num_blocks) bytes (checked by Create).
  KvPool(const KvLayout& layout, int num_blocks, std::unique_ptr<PoolMemory> memory);
  // Checks the layout, num_blocks > 0 and the memory size; kInvalidArgument otherwise.
  static Result<std::unique_ptr<KvPool>> Create(const KvLayout& layout, int num_blocks,
                                                std::unique_ptr<PoolMemory> memory);
  const KvLayout& layout() const { return layout_; }
  int num_blocks() const { return num_blocks_; }
  BlockAllocator& allocator() { return allocator_; }
  PoolMemory& memory() { return *memory_; }
  std::byte* base() const { return static_cast<std::byte*>(memory_->data()); }
  std::byte* layer_base(int layer) const { return base() + layout_.layer_bytes(num_blocks_) * layer; }
  std::byte* block_ptr(int layer, int block) const {
    return base() + layout_.block_offset(num_blocks_, layer, block);
  }

 private:
  KvLayout layout_;
  int num_blocks_;
  std::unique_ptr<PoolMemory> memory_;
  BlockAllocator allocator_;
};

// A pool in zero-filled host memory.
Result<std::unique_ptr<KvPool>> CreateHostPool(const KvLayout& layout, int num_blocks);

// Blocks needed to hold n tokens.
inline int BlocksForTokens(int n, int block_size) { return (n + block_size - 1) / block_size; }

// RAII ownership of a request's blocks: released into the allocator when destroyed unless
// Release()d earlier. Moves, never copies.
class BlockLease {
 public:
  BlockLease() = default;
  BlockLease(BlockAllocator* alloc, std::vector<int32_t> ids) : alloc_(alloc), ids_(std::move(ids)) {}
  BlockLease(BlockLease&& o) noexcept : alloc_(o.alloc_), ids_(std::move(o.ids_)) { o.alloc_ = nullptr; }
  BlockLease& operator=(BlockLease&& o) noexcept;
  BlockLease(const BlockLease&) = delete;
  BlockLease& operator=(const BlockLease&) = delete;
  ~BlockLease() { Reset(); }
  const std::vector<int32_t>& ids() const { return ids_; }
  // Allocates more blocks so that the lease covers n tokens (all-or-nothing; on
  // kResourceExhausted the lease is unchanged). kFailedPrecondition on a lease without an
  // allocator.
  Status GrowToTokens(int n_tokens, int block_size);
  // Releases every block now; the lease is then empty (and still bound to its allocator).
  void Reset();
  BlockAllocator* allocator() const { return alloc_; }

 private:
  BlockAllocator* alloc_ = nullptr;
  std::vector<int32_t> ids_;
};

}  // namespace kvstream::model
