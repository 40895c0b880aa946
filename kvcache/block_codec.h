// The stored form of one cached KV block, shared by the tiers below the GPU pool (host, disk,
// the shared store): every layer of one block, with a header that names what it is and an
// HMAC keyed by the cluster secret.
//
//   header (kBlockHeaderBytes, little-endian): magic "KVSTBLK\0", format version, header size,
//     root key (model identity, KV layout, salt: kvcache/prefix_key.h), the block's chained key,
//     model hash, the layout (layers, KV heads, head_dim, block size, dtype), tokens held,
//     per-layer bytes, payload bytes
//   payload: layer 0's block (K and V of every KV head, KvLayout::block_bytes()), then layer 1's...
//   trailer: CRC-32C over header + payload, 4 zero bytes, HMAC-SHA256(secret, header + payload)
//
// Guarantees:
//  - DecodeBlock accepts only an entry that is complete (exact length), uncorrupted (CRC),
//    of the expected identity (root key and layout; the key when asked) and authentic (HMAC,
//    compared in constant time); anything else is an error naming which check failed, and
//    never a payload. The CRC is checked before the HMAC, so a poisoned entry (valid CRC, HMAC
//    made without the secret) reads as kBadHmac, damage as kCorrupted / kTruncated.
//  - EncodeBlock(...) decodes back to the same header and payload under the same secret.
//  - Secrets shorter than kMinSecretBytes are refused by both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "kvcache/prefix_key.h"
#include "model/kv_cache.h"

namespace kvstream::kvcache {

inline constexpr uint32_t kBlockFormatVersion = 1;
inline constexpr size_t kBlockHeaderBytes = 136;
inline constexpr size_t kBlockTrailerBytes = 40;
inline constexpr size_t kMinSecretBytes = 16;

struct BlockHeader {
  BlockKey root{};          // RootKey(model hash, layout, salt)
  BlockKey key{};           // BlockKeyOf(parent, tokens)
  uint64_t model_hash = 0;
  model::KvLayout layout;
  uint32_t tokens = 0;      // tokens whose KV the block holds (block_size, or fewer for a last block)
  bool operator==(const BlockHeader&) const = default;
};

// What a reader expects: entries of another identity are refused unread.
struct BlockIdentity {
  BlockKey root{};
  model::KvLayout layout;
};

enum class BlockError {
  kNone,
  kTruncated,      // shorter than its header or than the length it declares
  kCorrupted,      // bad magic, trailing bytes, inconsistent fields, CRC mismatch
  kUnsupported,    // a format version this build does not read
  kWrongIdentity,  // another model / layout / salt, or another key than asked for
  kBadHmac,        // not written with this secret (or poisoned)
  kBadSecret,      // the secret given to the codec is too short
};
std::string_view BlockErrorName(BlockError e);

struct DecodedBlock {
  BlockError error = BlockError::kNone;
  std::string message;                 // empty when ok
  BlockHeader header;
  std::span<const std::byte> payload;  // points into the decoded bytes; empty unless ok
  bool ok() const { return error == BlockError::kNone; }
  // kDataLoss (truncated, corrupted, unsupported, bad HMAC), kFailedPrecondition (wrong
  // identity), kInvalidArgument (bad secret); the message names the check that failed.
  Status status() const;
};

// Bytes of an encoded entry for `layout` (header + num_layers * block_bytes + trailer).
size_t EncodedBlockBytes(const model::KvLayout& layout);

// Encodes header + the concatenation of `layers` (one span per layer, each block_bytes()).
// kInvalidArgument on a short secret or layers that do not match header.layout.
Result<std::vector<std::byte>> EncodeBlock(const BlockHeader& header,
                                           std::span<const std::span<const std::byte>> layers,
                                           std::string_view secret);
// The same into `out`, which must be EncodedBlockBytes(header.layout) long (kInvalidArgument
// otherwise): no allocation.
Status EncodeBlockTo(const BlockHeader& header, std::span<const std::span<const std::byte>> layers,
                     std::string_view secret, std::span<std::byte> out);

// Verifies `bytes` (see the guarantees). `key` non-null: the entry must be that block.
DecodedBlock DecodeBlock(std::span<const std::byte> bytes, const BlockIdentity& expected,
                         const BlockKey* key, std::string_view secret);

// Reads only the header's fixed fields (magic, version, lengths): for listing entries before
// reading them whole. Not verified: DecodeBlock still decides.
DecodedBlock PeekBlockHeader(std::span<const std::byte> bytes);

// CRC-32C (Castagnoli), chainable: Crc32c(b, Crc32c(a)) == Crc32c(a + b). With the CPU's
// CRC-32C instruction where it has one (x86-64 SSE4.2), else Crc32cTable; the same values.
uint32_t Crc32c(std::span<const std::byte> data, uint32_t crc = 0);
// The portable form (a byte-at-a-time table).
uint32_t Crc32cTable(std::span<const std::byte> data, uint32_t crc = 0);

}  // namespace kvstream::kvcache
