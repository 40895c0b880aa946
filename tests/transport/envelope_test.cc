// transport/core/envelope.h: the framing every backend's addresses, keys and messages use.
#include <gtest/gtest.h>

#include <string>

#include "transport/core/envelope.h"

namespace kvstream::transport::internal {
namespace {

constexpr WireTag kTag = {{'T', 'E', 'S', 'T'}, 7};

TEST(Envelope, RecordsBytesAndNotificationsComeBackAsWritten) {
  struct Head {
    uint64_t a;
    uint32_t b;
    uint32_t c;
  };
  PayloadWriter w;
  w.Record(Head{1, 2, 3}).Bytes("hello").Bytes("");
  AppendNotification(w, Notification{42, 7, 9, 5});
  const std::string blob = w.Seal(kTag, 3);
  auto e = OpenEnvelope(kTag, blob, "blob");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->type, 3);
  PayloadReader r(e->payload);
  Head h{};
  std::string_view s1, s2;
  Notification n;
  ASSERT_TRUE(r.Record(&h) && r.Bytes(&s1) && r.Bytes(&s2) && ReadNotification(r, &n));
  EXPECT_TRUE(r.done());
  EXPECT_EQ(h.a, 1u);
  EXPECT_EQ(h.c, 3u);
  EXPECT_EQ(s1, "hello");
  EXPECT_EQ(s2, "");
  EXPECT_EQ(n.request_id, 42u);
  EXPECT_EQ(n.layer, 7);
  EXPECT_EQ(n.flags, 9);
  EXPECT_EQ(n.landed_seq, 5u);
  EXPECT_FALSE(r.Record(&h));  // nothing left: refused, not read past the end
}

TEST(Envelope, ForeignTruncatedOrAlteredBlobsAreRefused) {
  const std::string blob = PayloadWriter().Bytes("payload").Seal(kTag, 1);
  EXPECT_EQ(OpenEnvelope(WireTag{{'O', 'T', 'H', 'R'}, 7}, blob, "x").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenEnvelope(WireTag{{'T', 'E', 'S', 'T'}, 8}, blob, "x").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenEnvelope(kTag, blob.substr(0, blob.size() - 1), "x").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenEnvelope(kTag, blob.substr(0, 10), "x").status().code(),
            StatusCode::kInvalidArgument);
  std::string altered = blob;
  altered.back() ^= 1;
  EXPECT_EQ(OpenEnvelope(kTag, altered, "x").status().code(), StatusCode::kInvalidArgument);
  // A record in a fixed-size mailbox: trailing bytes are fine only when asked for.
  const std::string mailbox = blob + std::string(32, '\0');
  EXPECT_FALSE(OpenEnvelope(kTag, mailbox, "x").ok());
  EXPECT_TRUE(OpenEnvelope(kTag, mailbox, "x", /*exact=*/false).ok());
}

TEST(Envelope, StreamHeadsAreCheckedBeforeTheirPayloadIsRead) {
  const std::string blob = PayloadWriter().Bytes("abc").Seal(kTag, 2);
  auto head = ReadEnvelopeHead(kTag, blob.data(), 64, "frame");
  ASSERT_TRUE(head.ok());
  EXPECT_TRUE(CheckEnvelopePayload(*head, std::string_view(blob).substr(16), "frame").ok());
  EXPECT_EQ(ReadEnvelopeHead(kTag, blob.data(), 2, "frame").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(CheckEnvelopePayload(*head, "xxxxxxx", "frame").code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace kvstream::transport::internal
