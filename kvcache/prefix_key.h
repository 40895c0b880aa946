// Keys of the prefix directory: SHA-256, chained block by block from a root that names what the
// KV was computed with.
//
// RootKey folds in a domain tag and version, the model identity (ModelConfig::hash(): shapes,
// rotary settings, dtypes, checkpoint identity), the KV layout (layers, KV heads, head_dim,
// block size, dtype) and a salt (a tenant's, or empty). BlockKeyOf(parent, tokens) hashes the
// parent key, the token count and the token ids (little-endian int32), so a full block and a
// partial one never collide, and equal keys mean equal token prefixes under the same root (to
// SHA-256's collision resistance).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/kv_cache.h"

namespace kvstream::kvcache {

using BlockKey = std::array<uint8_t, 32>;

BlockKey RootKey(uint64_t model_hash, const model::KvLayout& layout, std::string_view salt);
BlockKey BlockKeyOf(const BlockKey& parent, std::span<const int32_t> tokens);
// The keys of tokens' blocks chained from root: one per block of block_size tokens, the last one
// over the partial block when tokens.size() is not a multiple.
std::vector<BlockKey> ChainKeys(const BlockKey& root, std::span<const int32_t> tokens, int block_size);
// One block of KV named by its chained key, e.g. a block the prefix directory evicts and the
// tiers' write-back writes (kvcache/tiered_cache.h). Tier writes need nothing of its parents:
// `key` already chains them.
struct KeyedBlock {
  BlockKey root{};      // the chain's root (RootKey)
  BlockKey key{};       // ChainKeys(root, the tokens up to and including this block).back()
  uint32_t tokens = 0;  // tokens the block holds: block_size, or fewer (a prompt's last block)
  int32_t block = -1;   // its pool block
};

// Lower-case hex (for logs and tests; keys are not secrets, but salts are never logged).
std::string KeyHex(const BlockKey& key);

}  // namespace kvstream::kvcache
