#include "kvcache/prefix_key.h"

#include <algorithm>

#include <openssl/evp.h>

#include <cstring>
#include <stdexcept>
#include <vector>

namespace kvstream::kvcache {
namespace {

void PutU64(std::vector<uint8_t>* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}

BlockKey Sha256(const std::vector<uint8_t>& data) {
  BlockKey key{};
  unsigned int len = 0;
  // EVP_Digest of SHA-256 over memory cannot fail short of a broken libcrypto.
  if (EVP_Digest(data.data(), data.size(), key.data(), &len, EVP_sha256(), nullptr) != 1 ||
      len != key.size()) {
    throw std::runtime_error("libcrypto SHA-256 failed");
  }
  return key;
}

}  // namespace

BlockKey RootKey(uint64_t model_hash, const model::KvLayout& layout, std::string_view salt) {
  static constexpr char kTag[] = "kvstream.prefix.v1";
  std::vector<uint8_t> d(kTag, kTag + sizeof(kTag));
  PutU64(&d, model_hash);
  PutU64(&d, static_cast<uint64_t>(layout.num_layers));
  PutU64(&d, static_cast<uint64_t>(layout.num_kv_heads));
  PutU64(&d, static_cast<uint64_t>(layout.head_dim));
  PutU64(&d, static_cast<uint64_t>(layout.block_size));
  PutU64(&d, static_cast<uint64_t>(layout.dtype));
  PutU64(&d, salt.size());
  d.insert(d.end(), salt.begin(), salt.end());
  return Sha256(d);
}

BlockKey BlockKeyOf(const BlockKey& parent, std::span<const int32_t> tokens) {
  std::vector<uint8_t> d(parent.begin(), parent.end());
  PutU64(&d, tokens.size());
  for (int32_t t : tokens) {
    const uint32_t u = static_cast<uint32_t>(t);
    for (int i = 0; i < 4; ++i) d.push_back(static_cast<uint8_t>(u >> (8 * i)));
  }
  return Sha256(d);
}

std::string KeyHex(const BlockKey& key) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : key) {
    s.push_back(kDigits[b >> 4]);
    s.push_back(kDigits[b & 15]);
  }
  return s;
}

std::vector<BlockKey> ChainKeys(const BlockKey& root, std::span<const int32_t> tokens, int block_size) {
  std::vector<BlockKey> keys;
  BlockKey key = root;
  for (size_t pos = 0; pos < tokens.size(); pos += size_t(block_size)) {
    key = BlockKeyOf(key, tokens.subspan(pos, std::min<size_t>(size_t(block_size), tokens.size() - pos)));
    keys.push_back(key);
  }
  return keys;
}

}  // namespace kvstream::kvcache
