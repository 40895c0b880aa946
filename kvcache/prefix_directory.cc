#include "kvcache/prefix_directory.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kvstream::kvcache {

size_t PrefixDirectory::KeyHash::operator()(const BlockKey& k) const {
  size_t h;
  std::memcpy(&h, k.data(), sizeof(h));  // already uniformly distributed
  return h;
}

PrefixDirectory::PrefixDirectory(model::BlockAllocator* allocator,
                                 const DirectoryOptions& options)
    : allocator_(allocator), options_([&] {
        DirectoryOptions o = options;
        o.block_size = std::max(1, o.block_size);
        o.budget_blocks = std::max(0, o.budget_blocks);
        if (!(o.low_watermark > 0.0 && o.low_watermark <= 1.0)) o.low_watermark = 0.9;
        o.max_tokens = std::max(0, o.max_tokens);
        return o;
      }()) {}

// Whatever the callback would write to may be gone already.
PrefixDirectory::~PrefixDirectory() { Clear(/*closing=*/true, /*report=*/false); }

PrefixDirectory::Node* PrefixDirectory::Lookup(const BlockKey& key) const {
  auto it = nodes_.find(key);
  return it == nodes_.end() ? nullptr : it->second.get();
}

void PrefixDirectory::TouchLocked(Node* n) {
  // The node, then each ancestor, to the front: an ancestor is always more recent than its
  // descendants, so eviction (from the back) meets leaves before the nodes they hang from.
  for (Node* p = n; p != nullptr; p = p->parent) lru_.splice(lru_.begin(), lru_, p->lru);
}

bool PrefixDirectory::EvictableLocked(const Node* n) const {
  // The directory holds one reference; more means a request's lease still reads the block.
  return n->children == 0 && allocator_->refcount(n->block) <= 1;
}

void PrefixDirectory::EraseLocked(Node* n, std::vector<KeyedBlock>* victims) {
  victims->push_back({n->root, n->key, n->tokens, n->block});
  if (n->parent != nullptr) --n->parent->children;
  lru_.erase(n->lru);
  --stats_.blocks;
  nodes_.erase(n->key);
}

void PrefixDirectory::ReleaseLocked(const std::vector<KeyedBlock>& victims, bool report) {
  if (victims.empty()) return;
  // The callback takes its own references before the directory lets go of its.
  if (report && on_evict_) on_evict_(victims);
  std::vector<int32_t> ids;
  ids.reserve(victims.size());
  for (const KeyedBlock& v : victims) ids.push_back(v.block);
  allocator_->Release(ids).IgnoreError();
}

template <typename Pred>
bool PrefixDirectory::EvictUntilLocked(Pred pred) {
  std::vector<KeyedBlock> victims;
  auto it = lru_.end();
  while (!pred(int(victims.size())) && it != lru_.begin()) {
    --it;
    Node* n = *it;
    if (!EvictableLocked(n)) continue;
    ++it;  // stays valid: it points past the victim (its parent, more recent, is still ahead)
    EraseLocked(n, &victims);
    ++stats_.evicted_blocks;
  }
  ReleaseLocked(victims, /*report=*/true);
  return pred(0);
}

PrefixDirectory::Match PrefixDirectory::Find(const BlockKey& root,
                                             std::span<const int32_t> tokens) {
  Match m;
  if (!enabled() || tokens.empty()) return m;
  const int bs = options_.block_size;
  const int n = static_cast<int>(std::min<size_t>(tokens.size(), size_t(options_.max_tokens)));
  std::vector<int32_t> ids;
  std::lock_guard<std::mutex> lock(mu_);
  BlockKey key = root;
  Node* last = nullptr;
  int matched = 0;
  while (matched < n) {
    const int len = std::min(bs, n - matched);
    // A partial block matches only as the prompt's very end.
    if (len < bs && matched + len != static_cast<int>(tokens.size())) break;
    BlockKey k = BlockKeyOf(key, tokens.subspan(matched, len));
    Node* node = Lookup(k);
    if (node == nullptr) break;
    ids.push_back(node->block);
    last = node;
    key = k;
    matched += len;
  }
  if (matched == 0) return m;
  // Cannot fail: the directory holds a reference on every block it names.
  if (!allocator_->Ref(ids).ok()) return m;
  TouchLocked(last);
  m.tokens = matched;
  m.lease = model::BlockLease(allocator_, std::move(ids));
  return m;
}

void PrefixDirectory::CountLookup(int matched_tokens) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (matched_tokens > 0) {
    ++stats_.hits;
    stats_.hit_tokens += static_cast<uint64_t>(matched_tokens);
  } else {
    ++stats_.misses;
  }
}

int PrefixDirectory::Insert(const BlockKey& root, std::span<const int32_t> tokens,
                            const std::vector<int32_t>& ids, int* cached_tokens) {
  if (cached_tokens != nullptr) *cached_tokens = 0;
  if (!enabled() || tokens.empty()) return 0;
  const int bs = options_.block_size;
  const int n = static_cast<int>(std::min<size_t>(tokens.size(), size_t(options_.max_tokens)));
  if (static_cast<int64_t>(ids.size()) * bs < n) return 0;  // ids must cover the tokens
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) return 0;
  BlockKey key = root;
  Node* parent = nullptr;
  int added = 0;
  int pos = 0;
  for (int b = 0; pos < n; ++b, pos += bs) {
    const int len = std::min(bs, n - pos);
    if (len < bs && pos + len != static_cast<int>(tokens.size())) break;  // cut by max_tokens
    BlockKey k = BlockKeyOf(key, tokens.subspan(pos, len));
    Node* node = Lookup(k);
    if (node == nullptr) {
      if (parent != nullptr && parent->partial) break;
      if (stats_.blocks >= options_.budget_blocks) {
        const int low = std::max(0, static_cast<int>(std::floor(options_.budget_blocks *
                                                                 options_.low_watermark)) - 1);
        // The path being extended is pinned while others are evicted.
        if (parent != nullptr && !allocator_->Ref({parent->block}).ok()) break;
        const bool room = EvictUntilLocked([&](int) { return stats_.blocks <= low; }) ||
                          stats_.blocks < options_.budget_blocks;
        if (parent != nullptr) allocator_->Release({parent->block}).IgnoreError();
        if (!room) break;
      }
      if (!allocator_->Ref({ids[b]}).ok()) break;
      auto owned = std::make_unique<Node>();
      node = owned.get();
      node->key = k;
      node->root = root;
      node->tokens = uint32_t(len);
      node->parent = parent;
      node->block = ids[b];
      node->partial = len < bs;
      lru_.push_front(node);
      node->lru = lru_.begin();
      if (parent != nullptr) ++parent->children;
      nodes_.emplace(k, std::move(owned));
      ++stats_.blocks;
      ++stats_.inserted_blocks;
      ++added;
    }
    TouchLocked(node);
    parent = node;
    key = k;
  }
  if (cached_tokens != nullptr) *cached_tokens = std::min(pos, n);
  return added;
}

int PrefixDirectory::EvictForAllocation(int free_blocks) {
  std::lock_guard<std::mutex> lock(mu_);
  const int before = stats_.blocks;
  // A victim is counted as room at once: freed by the release, or once its write-back is done.
  EvictUntilLocked([&](int victims) { return allocator_->free_count() + victims >= free_blocks; });
  return before - stats_.blocks;
}

void PrefixDirectory::Clear(bool closing, bool report) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closing) closing_ = true;
  std::vector<KeyedBlock> victims;
  for (const auto& [key, node] : nodes_) victims.push_back({node->root, node->key, node->tokens, node->block});
  ReleaseLocked(victims, report);
  nodes_.clear();
  lru_.clear();
  stats_.blocks = 0;
}

PrefixDirectory::Stats PrefixDirectory::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.nodes = static_cast<int>(nodes_.size());
  return s;
}

}  // namespace kvstream::kvcache
