// Fuzzes kvcache/block_codec.h's DecodeBlock (the bytes of a disk file or a shared-store value,
// which whoever can write the folder or the store controls).
// data[0] picks the case: even, the rest is decoded as it is; odd, a valid entry is encoded
// from the rest (its first bytes as the payload seed) and then mutated at the offsets the rest
// names, so the checks past the CRC are reached too.
// Invariants: no crash or read past the input; a payload only with ok(), and then exactly the
// layout's bytes inside the input; a mutated entry never decodes to other bytes than encoded.
#include <cstdint>
#include <cstring>
#include <vector>

#include "kvcache/block_codec.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using namespace kvstream;
using namespace kvstream::kvcache;

constexpr std::string_view kSecret = "fuzz-cluster-secret-0123456789";

model::KvLayout Layout() {
  model::KvLayout l;
  l.num_layers = 2;
  l.num_kv_heads = 1;
  l.head_dim = 4;
  l.block_size = 2;
  return l;
}

void CheckDecoded(const DecodedBlock& d, std::span<const std::byte> in) {
  if (!d.ok()) {
    if (!d.payload.empty()) fuzz::Fail("a payload with an error");
    if (d.message.empty()) fuzz::Fail("an error without a message");
    return;
  }
  const size_t want = size_t(Layout().num_layers) * Layout().block_bytes();
  if (d.payload.size() != want) fuzz::Fail("payload of the wrong size");
  if (d.payload.data() < in.data() || d.payload.data() + d.payload.size() > in.data() + in.size())
    fuzz::Fail("payload outside the input");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const model::KvLayout layout = Layout();
  const BlockIdentity id{RootKey(1, layout, ""), layout};
  const auto rest = std::as_bytes(std::span(data + 1, size - 1));
  if ((data[0] & 1) == 0) {
    CheckDecoded(DecodeBlock(rest, id, nullptr, kSecret), rest);
    CheckDecoded(PeekBlockHeader(rest).ok() ? DecodeBlock(rest, id, &id.root, kSecret)
                                            : PeekBlockHeader(rest),
                 rest);
    return 0;
  }
  BlockHeader h;
  h.root = id.root;
  h.key = BlockKeyOf(id.root, std::vector<int32_t>{1, 2});
  h.model_hash = 1;
  h.layout = layout;
  h.tokens = 1 + (data[0] >> 1) % 2;
  std::vector<std::vector<std::byte>> layers(layout.num_layers,
                                             std::vector<std::byte>(layout.block_bytes()));
  for (size_t i = 0; i < layers.size() * layers[0].size() && i < rest.size(); ++i)
    layers[i / layers[0].size()][i % layers[0].size()] = rest[i];
  std::vector<std::span<const std::byte>> spans(layers.begin(), layers.end());
  auto enc = EncodeBlock(h, spans, kSecret);
  if (!enc.ok()) fuzz::Fail("encode failed: " + enc.status().ToString());
  std::vector<std::byte> bytes = std::move(*enc);
  {
    DecodedBlock d = DecodeBlock(bytes, id, &h.key, kSecret);
    if (!d.ok() || !(d.header == h)) fuzz::Fail("a fresh entry does not decode: " + d.message);
  }
  // Mutations: (offset, xor) pairs from the rest; an odd count of trailing bytes cuts the entry.
  bool changed = false;
  for (size_t i = 0; i + 1 < rest.size(); i += 2) {
    const size_t at = static_cast<size_t>(rest[i]) * 7 % bytes.size();
    const std::byte x = rest[i + 1];
    if (x != std::byte{0}) changed = true;
    bytes[at] ^= x;
  }
  if (rest.size() % 2 == 1 && static_cast<uint8_t>(rest.back()) < bytes.size()) {
    bytes.resize(bytes.size() - 1 - static_cast<uint8_t>(rest.back()));
    changed = true;
  }
  DecodedBlock d = DecodeBlock(bytes, id, &h.key, kSecret);
  CheckDecoded(d, bytes);
  if (changed && d.ok()) {
    // Only a mutation that cancelled itself out (the same bytes again) may decode.
    for (size_t l = 0; l < layers.size(); ++l)
      if (std::memcmp(d.payload.data() + l * layers[l].size(), layers[l].data(), layers[l].size()))
        fuzz::Fail("a mutated entry decoded to other KV");
  }
  return 0;
}
