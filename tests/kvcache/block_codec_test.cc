// Unit: kvcache/block_codec.h (round trip; truncated, corrupted, wrong-identity, poisoned and
// unknown-version entries refused with the check that failed named; short secrets refused).
#include "kvcache/block_codec.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace kvstream::kvcache {
namespace {

const std::string kSecret = "0123456789abcdef-cluster-secret";

model::KvLayout Layout() {
  model::KvLayout l;
  l.num_layers = 3;
  l.num_kv_heads = 2;
  l.head_dim = 4;
  l.block_size = 4;
  return l;
}

struct Entry {
  BlockHeader header;
  std::vector<std::vector<std::byte>> layers;
  std::vector<std::byte> bytes;
};

Entry Make(const model::KvLayout& l = Layout(), uint32_t tokens = 4, uint64_t model = 7) {
  Entry e;
  e.header.model_hash = model;
  e.header.layout = l;
  e.header.root = RootKey(model, l, "");
  const std::vector<int32_t> toks = {1, 2, 3, 4};
  e.header.key = BlockKeyOf(e.header.root, toks);
  e.header.tokens = tokens;
  std::vector<std::span<const std::byte>> spans;
  for (int i = 0; i < l.num_layers; ++i) {
    e.layers.emplace_back(l.block_bytes());
    for (size_t j = 0; j < e.layers.back().size(); ++j)
      e.layers.back()[j] = static_cast<std::byte>(i * 31 + j);
  }
  for (const auto& v : e.layers) spans.emplace_back(v);
  auto enc = EncodeBlock(e.header, spans, kSecret);
  EXPECT_TRUE(enc.ok()) << enc.status().ToString();
  e.bytes = std::move(*enc);
  return e;
}

BlockIdentity IdOf(const Entry& e) { return {e.header.root, e.header.layout}; }

TEST(BlockCodec, RoundTrip) {
  Entry e = Make();
  EXPECT_EQ(e.bytes.size(), EncodedBlockBytes(Layout()));
  DecodedBlock d = DecodeBlock(e.bytes, IdOf(e), &e.header.key, kSecret);
  ASSERT_TRUE(d.ok()) << d.message;
  EXPECT_TRUE(d.status().ok());
  EXPECT_EQ(d.header, e.header);
  ASSERT_EQ(d.payload.size(), 3 * Layout().block_bytes());
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(0, std::memcmp(d.payload.data() + i * Layout().block_bytes(), e.layers[i].data(),
                             e.layers[i].size()));
  // Without a key asked for, the same.
  EXPECT_TRUE(DecodeBlock(e.bytes, IdOf(e), nullptr, kSecret).ok());
  EXPECT_TRUE(PeekBlockHeader(e.bytes).ok());
}

TEST(BlockCodec, PartialBlock) {
  Entry e = Make(Layout(), 3);
  DecodedBlock d = DecodeBlock(e.bytes, IdOf(e), nullptr, kSecret);
  ASSERT_TRUE(d.ok()) << d.message;
  EXPECT_EQ(d.header.tokens, 3u);
}

TEST(BlockCodec, TruncatedAtEveryLength) {
  Entry e = Make();
  for (size_t n = 0; n < e.bytes.size(); n += (n < 200 ? 1 : 17)) {
    DecodedBlock d = DecodeBlock(std::span(e.bytes).subspan(0, n), IdOf(e), nullptr, kSecret);
    ASSERT_FALSE(d.ok()) << n;
    EXPECT_EQ(d.error, BlockError::kTruncated) << n << " " << d.message;
    EXPECT_TRUE(d.payload.empty());
    EXPECT_EQ(d.status().code(), StatusCode::kDataLoss);
  }
  auto longer = e.bytes;
  longer.push_back(std::byte{0});
  EXPECT_EQ(DecodeBlock(longer, IdOf(e), nullptr, kSecret).error, BlockError::kCorrupted);
}

TEST(BlockCodec, EveryFlippedByteIsRefused) {
  Entry e = Make();
  for (size_t i = 0; i < e.bytes.size(); ++i) {
    auto bad = e.bytes;
    bad[i] ^= std::byte{0x01};
    DecodedBlock d = DecodeBlock(bad, IdOf(e), nullptr, kSecret);
    ASSERT_FALSE(d.ok()) << "byte " << i;
    EXPECT_TRUE(d.payload.empty());
    // The HMAC's own bytes are not under the CRC: flipping them reads as a bad HMAC.
    if (i < e.bytes.size() - 32) {
      EXPECT_NE(d.error, BlockError::kBadHmac) << "byte " << i << ": " << d.message;
    } else {
      EXPECT_EQ(d.error, BlockError::kBadHmac) << "byte " << i;
    }
  }
}

TEST(BlockCodec, PoisonedEntryWithValidChecksumIsRefused) {
  Entry e = Make();
  // Whoever can write the folder but lacks the secret: new payload, recomputed CRC, HMAC
  // made with another key.
  Entry forged = e;
  std::vector<std::span<const std::byte>> spans;
  for (auto& l : forged.layers) {
    l[0] = std::byte{0x42};
    spans.emplace_back(l);
  }
  auto enc = EncodeBlock(forged.header, spans, "another-secret-of-16+bytes");
  ASSERT_TRUE(enc.ok());
  DecodedBlock d = DecodeBlock(*enc, IdOf(e), &e.header.key, kSecret);
  EXPECT_EQ(d.error, BlockError::kBadHmac) << d.message;
  EXPECT_TRUE(d.payload.empty());
  EXPECT_EQ(d.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(d.status().message().find("bad HMAC"), std::string::npos);
}

TEST(BlockCodec, WrongIdentityIsRefused) {
  Entry e = Make();
  // Another model.
  Entry other = Make(Layout(), 4, /*model=*/8);
  DecodedBlock d = DecodeBlock(other.bytes, IdOf(e), nullptr, kSecret);
  EXPECT_EQ(d.error, BlockError::kWrongIdentity) << d.message;
  EXPECT_EQ(d.status().code(), StatusCode::kFailedPrecondition);
  // Another layout (dtype; block size) under the same root the reader expects.
  model::KvLayout bf = Layout();
  bf.dtype = DType::kBF16;
  EXPECT_EQ(DecodeBlock(e.bytes, {e.header.root, bf}, nullptr, kSecret).error,
            BlockError::kWrongIdentity);
  model::KvLayout bs8 = Layout();
  bs8.block_size = 8;
  EXPECT_EQ(DecodeBlock(Make(bs8).bytes, IdOf(e), nullptr, kSecret).error,
            BlockError::kWrongIdentity);
  // Another block than asked for.
  BlockKey k = e.header.key;
  k[0] ^= 1;
  EXPECT_EQ(DecodeBlock(e.bytes, IdOf(e), &k, kSecret).error, BlockError::kWrongIdentity);
}

TEST(BlockCodec, UnknownVersionAndMagic) {
  Entry e = Make();
  auto v2 = e.bytes;
  v2[8] = std::byte{2};
  EXPECT_EQ(DecodeBlock(v2, IdOf(e), nullptr, kSecret).error, BlockError::kUnsupported);
  auto junk = e.bytes;
  junk[0] = std::byte{'X'};
  EXPECT_EQ(DecodeBlock(junk, IdOf(e), nullptr, kSecret).error, BlockError::kCorrupted);
}

TEST(BlockCodec, SecretsAndLayersChecked) {
  Entry e = Make();
  EXPECT_EQ(DecodeBlock(e.bytes, IdOf(e), nullptr, "short").error, BlockError::kBadSecret);
  EXPECT_EQ(DecodeBlock(e.bytes, IdOf(e), nullptr, "").status().code(),
            StatusCode::kInvalidArgument);
  std::vector<std::span<const std::byte>> spans;
  for (const auto& l : e.layers) spans.emplace_back(l);
  EXPECT_EQ(EncodeBlock(e.header, spans, "short").status().code(), StatusCode::kInvalidArgument);
  spans.pop_back();
  EXPECT_EQ(EncodeBlock(e.header, spans, kSecret).status().code(), StatusCode::kInvalidArgument);
  spans.emplace_back(std::span(e.layers[0]).subspan(1));
  EXPECT_EQ(EncodeBlock(e.header, spans, kSecret).status().code(), StatusCode::kInvalidArgument);
  // Another secret: the same entry is refused.
  EXPECT_EQ(DecodeBlock(e.bytes, IdOf(e), nullptr, kSecret + "x").error, BlockError::kBadHmac);
}

TEST(BlockCodec, Crc32cKnownValue) {
  const char* s = "123456789";
  EXPECT_EQ(Crc32c(std::as_bytes(std::span(s, 9))), 0xE3069283u);
  EXPECT_EQ(Crc32c(std::as_bytes(std::span(s + 4, 5)), Crc32c(std::as_bytes(std::span(s, 4)))),
            0xE3069283u);
  EXPECT_EQ(Crc32cTable(std::as_bytes(std::span(s, 9))), 0xE3069283u);
}

// The instruction path (where the CPU has one) and the table give the same CRC for every length
// 0..300 at every start offset 0..8 (the 8-byte steps and the byte tail), and over 2 MiB + 176
// chained at an odd split.
TEST(BlockCodec, Crc32cEqualsTheTableForEveryLengthAndOffset) {
  std::vector<std::byte> buf((2u << 20) + 176 + 16);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (auto& b : buf) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<std::byte>(x);
  }
  for (size_t off = 0; off <= 8; ++off)
    for (size_t n = 0; n <= 300; ++n) {
      const std::span<const std::byte> d(buf.data() + off, n);
      ASSERT_EQ(Crc32c(d), Crc32cTable(d)) << "offset " << off << " length " << n;
      ASSERT_EQ(Crc32c(d, 0x12345678u), Crc32cTable(d, 0x12345678u)) << off << " " << n;
    }
  const std::span<const std::byte> all(buf.data() + 3, (2u << 20) + 176);
  EXPECT_EQ(Crc32c(all), Crc32cTable(all));
  EXPECT_EQ(Crc32c(all.subspan(1001), Crc32c(all.first(1001))), Crc32cTable(all));
}

}  // namespace
}  // namespace kvstream::kvcache
