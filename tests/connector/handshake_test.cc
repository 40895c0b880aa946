#include "connector/handshake.h"
#include "connector/notification_mac.h"

#include <gtest/gtest.h>

#include "connector/grpc_status.h"
#include "connector/prefill_connector.h"

namespace kvstream::connector {
namespace {

LayoutDescriptor Tiny() {
  auto cfg = model::PresetConfig("tiny");
  EXPECT_TRUE(cfg.ok());
  return MakeLayoutDescriptor(*cfg, 16);
}

void ExpectRefusedNaming(const LayoutDescriptor& a, const LayoutDescriptor& b,
                         const std::string& field) {
  Status s = CheckCompatible(a, b);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << field;
  EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
}

TEST(Handshake, IdenticalLayoutsAreCompatible) {
  EXPECT_TRUE(CheckCompatible(Tiny(), Tiny()).ok());
}

TEST(Handshake, EachFieldMismatchIsRefusedNamingIt) {
  const LayoutDescriptor base = Tiny();
  LayoutDescriptor d = base;
  d.layout.num_layers += 1;
  ExpectRefusedNaming(base, d, "num_layers");
  d = base;
  d.layout.num_kv_heads *= 2;
  ExpectRefusedNaming(base, d, "num_kv_heads");
  d = base;
  d.layout.head_dim *= 2;
  ExpectRefusedNaming(base, d, "head_dim");
  d = base;
  d.layout.block_size = 32;
  ExpectRefusedNaming(base, d, "block_size");
  d = base;
  d.layout.dtype = DType::kBF16;
  ExpectRefusedNaming(base, d, "dtype");
  d = base;
  d.model_hash ^= 1;
  ExpectRefusedNaming(base, d, "model_hash");
  d = base;
  d.protocol_version += 1;
  ExpectRefusedNaming(base, d, "protocol_version");
}

TEST(Handshake, DifferentSeedChangesModelHash) {
  auto a = model::PresetConfig("tiny", 1);
  auto b = model::PresetConfig("tiny", 2);
  ASSERT_TRUE(a.ok() && b.ok());
  ExpectRefusedNaming(MakeLayoutDescriptor(*a, 16), MakeLayoutDescriptor(*b, 16), "model_hash");
}

TEST(Handshake, ProtoRoundTrip) {
  LayoutDescriptor d = Tiny();
  kvstream::v1::LayoutDescriptor p;
  ToProto(d, &p);
  auto back = FromProto(p);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(CheckCompatible(d, *back).ok());
  EXPECT_EQ(back->model_name, "tiny");
  p.set_dtype("f8");
  EXPECT_EQ(FromProto(p).status().code(), StatusCode::kInvalidArgument);
  ToProto(d, &p);
  p.set_block_size(0);
  EXPECT_EQ(FromProto(p).status().code(), StatusCode::kInvalidArgument);
}

TEST(GrpcStatus, EveryCodeRoundTrips) {
  for (int c = 1; c <= static_cast<int>(StatusCode::kInternal); ++c) {
    Status s(static_cast<StatusCode>(c), "what failed");
    Status back = FromGrpc(ToGrpc(s));
    EXPECT_EQ(back.code(), s.code()) << s.ToString();
    EXPECT_EQ(back.message(), "what failed");
  }
  EXPECT_TRUE(FromGrpc(ToGrpc(OkStatus())).ok());
  EXPECT_EQ(ToGrpc(Timeout("x")).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(ToGrpc(RemoteDisconnect("x")).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST(GrpcStatus, DeadlinesConvertBothWays) {
  Deadline d = DeadlineAfterMs(1500);
  Deadline back = FromGrpcDeadline(ToGrpcDeadline(d));
  EXPECT_LT(std::chrono::abs(back - d), std::chrono::milliseconds(5));
}

TEST(CopyOps, NeighbouringBlocksCoalesce) {
  model::KvLayout layout{2, 2, 8, 4, DType::kF16};
  const uint64_t bb = layout.block_bytes();
  // Local 3,4,5 -> remote 10,11,13: the first two merge, the third does not (remote gap).
  auto ops = LayerCopyOps(layout, 1, 8, {3, 4, 5}, 16, {10, 11, 13});
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[0].local_offset, layout.block_offset(8, 1, 3));
  EXPECT_EQ(ops[0].remote_offset, layout.block_offset(16, 1, 10));
  EXPECT_EQ(ops[0].length, 2 * bb);
  EXPECT_EQ(ops[1].local_offset, layout.block_offset(8, 1, 5));
  EXPECT_EQ(ops[1].remote_offset, layout.block_offset(16, 1, 13));
  EXPECT_EQ(ops[1].length, bb);
  // Local gap breaks a run too.
  EXPECT_EQ(LayerCopyOps(layout, 0, 8, {1, 3}, 16, {4, 5}).size(), 2u);
}

// The decode's check of notification MACs (notification_mac.h): the genuine tag of the current
// epoch passes; a forged tag, a tag of an earlier epoch (a late or replayed notification of an
// earlier link), of another session, or moved onto another request or layer is dropped and
// counted.
TEST(NotificationMacTest, OnlyTheCurrentEpochsTagForItsRequestAndLayerPasses) {
  const std::string secret(32, 's');
  NotificationVerifier v(secret, "decode-1");
  v.set_epoch(3);
  auto note = [](uint64_t request, int32_t layer, const NotificationMac& mac) {
    transport::Notification n;
    n.request_id = request;
    n.layer = layer;
    n.mac = mac;
    return n;
  };
  const NotificationMac good = ComputeNotificationMac(secret, "decode-1", 7, 2, 3);
  EXPECT_TRUE(v.Verify(note(7, 2, good)));
  EXPECT_FALSE(v.Verify(note(7, 2, NotificationMac{})));                                 // forged
  EXPECT_FALSE(v.Verify(note(8, 2, good)));                                   // another request
  EXPECT_FALSE(v.Verify(note(7, 1, good)));                                     // another layer
  EXPECT_FALSE(v.Verify(note(7, 2, ComputeNotificationMac(secret, "decode-1", 7, 2, 2))));  // stale
  EXPECT_FALSE(v.Verify(note(7, 2, ComputeNotificationMac(secret, "decode-2", 7, 2, 3))));  // foreign
  EXPECT_FALSE(v.Verify(note(7, 2, ComputeNotificationMac(std::string(32, 't'), "decode-1", 7, 2, 3))));
  EXPECT_EQ(v.dropped(), 6u);
  v.set_epoch(4);  // a new handshake: the old link's tags stop counting
  EXPECT_FALSE(v.Verify(note(7, 2, good)));
  EXPECT_EQ(v.dropped(), 7u);
  EXPECT_NE(ComputeNotificationMac(secret, "decode-1", 7, 2, 3),
            ComputeNotificationMac(secret, "decode-1", 7, 2, 4));
}

}  // namespace
}  // namespace kvstream::connector
