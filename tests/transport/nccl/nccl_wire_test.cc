// The nccl backend's host-side protocol (transport/nccl/nccl_wire.h): address and key round trips,
// frame parsing of partial and corrupt input, write headers, chunk planning, mode choice.
#include "transport/nccl/nccl_wire.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <random>

namespace kvstream::transport::nccl {
namespace {

std::string SomeId() {
  std::string id(kUniqueIdBytes, '\0');
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(i * 37 + 11);
  return id;
}

TEST(NcclWire, AddressRoundTrip) {
  Address a{"10.1.2.3", 40123, SomeId()};
  const std::string text = EncodeAddress(a);
  EXPECT_EQ(text.rfind("nccl:tcp:10.1.2.3:40123:", 0), 0u) << text;
  auto b = DecodeAddress(text);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->host, a.host);
  EXPECT_EQ(b->port, a.port);
  EXPECT_EQ(b->unique_id, a.unique_id);
}

TEST(NcclWire, AddressRefusesGarbage) {
  const std::string good = EncodeAddress({"h", 5, SomeId()});
  for (const std::string& bad :
       {std::string("unix:@x"), std::string("nccl:tcp:"), std::string("nccl:tcp:h:5"),
        std::string("nccl:tcp::5:") + good.substr(good.rfind(':') + 1),
        std::string("nccl:tcp:h:0:") + good.substr(good.rfind(':') + 1),
        std::string("nccl:tcp:h:70000:") + good.substr(good.rfind(':') + 1),
        std::string("nccl:tcp:h:x5:") + good.substr(good.rfind(':') + 1),
        good.substr(0, good.size() - 2), good.substr(0, good.size() - 1) + "z"}) {
    auto r = DecodeAddress(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    }
  }
}

TEST(NcclWire, KeyRoundTripAndRefusals) {
  Key k;
  k.registration_id = 42;
  k.length = 1 << 20;
  k.device = 1;
  std::strcpy(k.pci_bus_id, "0000:19:00.0");
  std::strcpy(k.host_id, "boot-id-1");
  auto d = DecodeKey(EncodeKey(k));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->registration_id, 42u);
  EXPECT_EQ(d->length, 1u << 20);
  EXPECT_EQ(d->device, 1);
  EXPECT_STREQ(d->pci_bus_id, "0000:19:00.0");
  EXPECT_STREQ(d->host_id, "boot-id-1");
  EXPECT_EQ(DecodeKey("short").status().code(), StatusCode::kInvalidArgument);
  std::string blob = EncodeKey(k);
  blob[0] = 'X';
  EXPECT_EQ(DecodeKey(blob).status().code(), StatusCode::kInvalidArgument);
  k.length = 0;
  EXPECT_EQ(DecodeKey(EncodeKey(k)).status().code(), StatusCode::kInvalidArgument);
}

TEST(NcclWire, WriteHeaderRoundTripThroughPartialFrames) {
  WriteHeader h;
  h.write_id = 7;
  h.registration_id = 3;
  h.mode = WireMode::kPack;
  h.notify = true;
  h.notification = {0xABCDEF0123ull, 31, 1};
  for (size_t i = 0; i < h.notification.mac.size(); ++i) h.notification.mac[i] = uint8_t(0xA0 + i);
  for (uint64_t i = 0; i < 100; ++i) {
    h.runs.push_back({i * 4096 * 3, 4096 + 16 * i});
    h.total_bytes += 4096 + 16 * i;
  }
  std::string stream = EncodeHello(Hello{}) + EncodeWrite(h) + EncodeAck(Ack{7, 0});
  std::string buf;
  std::vector<FrameType> types;
  std::vector<std::string> payloads;
  // Byte by byte: a frame is taken only once complete.
  for (char c : stream) {
    buf.push_back(c);
    FrameType t;
    std::string p;
    auto got = TakeFrame(&buf, &t, &p);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    if (got.value()) {
      types.push_back(t);
      payloads.push_back(p);
    }
  }
  EXPECT_TRUE(buf.empty());
  ASSERT_EQ(types.size(), 3u);
  EXPECT_EQ(types[0], FrameType::kHello);
  EXPECT_EQ(types[1], FrameType::kWrite);
  EXPECT_EQ(types[2], FrameType::kAck);
  auto d = DecodeWrite(payloads[1]);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->write_id, 7u);
  EXPECT_EQ(d->registration_id, 3u);
  EXPECT_EQ(d->total_bytes, h.total_bytes);
  EXPECT_EQ(d->mode, WireMode::kPack);
  EXPECT_TRUE(d->notify);
  EXPECT_EQ(d->notification.request_id, h.notification.request_id);
  EXPECT_EQ(d->notification.layer, 31);
  EXPECT_EQ(d->notification.flags, 1);
  EXPECT_EQ(d->notification.mac, h.notification.mac) << "the notification's MAC was not carried";
  ASSERT_EQ(d->runs.size(), h.runs.size());
  for (size_t i = 0; i < h.runs.size(); ++i) {
    EXPECT_EQ(d->runs[i].remote_offset, h.runs[i].remote_offset);
    EXPECT_EQ(d->runs[i].length, h.runs[i].length);
  }
  auto ack = DecodeAck(payloads[2]);
  ASSERT_TRUE(ack.ok());
  EXPECT_EQ(ack->write_id, 7u);
}

TEST(NcclWire, HelloRoundTripCarriesTheWarmUpChoice) {
  for (uint32_t warm_up : {0u, 1u}) {
    Hello h;
    h.device = 3;
    h.chunk_bytes = 1 << 20;
    std::strcpy(h.pci_bus_id, "0000:19:00.0");
    h.warm_up = warm_up;
    auto d = DecodeHello(EncodeHello(h).substr(sizeof(FrameHead)));
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d->version, kProtocolVersion);
    EXPECT_EQ(d->device, 3);
    EXPECT_EQ(d->chunk_bytes, 1u << 20);
    EXPECT_STREQ(d->pci_bus_id, "0000:19:00.0");
    EXPECT_EQ(d->warm_up, warm_up);
  }
  EXPECT_EQ(Hello{}.warm_up, 1u) << "a writer warms up unless told not to";
  // A hello of the previous protocol (no warm-up field) is refused, not misread.
  const std::string payload = EncodeHello(Hello{}).substr(sizeof(FrameHead));
  EXPECT_EQ(DecodeHello(payload.substr(0, payload.size() - 8)).status().code(), StatusCode::kDataLoss);
}

TEST(NcclWire, CorruptFramesAndHeadersAreRefused) {
  std::string buf = EncodeAck(Ack{1, 0});
  buf[0] ^= 1;  // magic
  FrameType t;
  std::string p;
  EXPECT_EQ(TakeFrame(&buf, &t, &p).status().code(), StatusCode::kDataLoss);
  buf = EncodeFrame(static_cast<FrameType>(99), nullptr, 0);
  EXPECT_EQ(TakeFrame(&buf, &t, &p).status().code(), StatusCode::kDataLoss);
  FrameHead huge;
  huge.type = static_cast<uint32_t>(FrameType::kWrite);
  huge.payload = kMaxPayload + 1;
  buf.assign(reinterpret_cast<const char*>(&huge), sizeof(huge));
  EXPECT_EQ(TakeFrame(&buf, &t, &p).status().code(), StatusCode::kDataLoss);

  WriteHeader h;
  h.runs = {{0, 100}, {200, 50}};
  h.total_bytes = 150;
  std::string frame = EncodeWrite(h);
  std::string payload = frame.substr(sizeof(FrameHead));
  ASSERT_TRUE(DecodeWrite(payload).ok());
  EXPECT_EQ(DecodeWrite(payload.substr(0, payload.size() - 1)).status().code(), StatusCode::kDataLoss);
  h.total_bytes = 151;  // does not match the runs
  payload = EncodeWrite(h).substr(sizeof(FrameHead));
  EXPECT_EQ(DecodeWrite(payload).status().code(), StatusCode::kDataLoss);
  h.total_bytes = 150;
  h.mode = static_cast<WireMode>(5);
  payload = EncodeWrite(h).substr(sizeof(FrameHead));
  EXPECT_EQ(DecodeWrite(payload).status().code(), StatusCode::kDataLoss);
  h.mode = WireMode::kDirect;
  h.runs = {{0, ~0ull}, {0, 2}};  // lengths overflow
  h.total_bytes = 1;
  payload = EncodeWrite(h).substr(sizeof(FrameHead));
  EXPECT_EQ(DecodeWrite(payload).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(DecodeHello("x").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(DecodeAck("").status().code(), StatusCode::kDataLoss);
}

TEST(NcclWire, PlanChunksCoversEveryByteOnceInOrder) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<WireRun> runs;
    uint64_t total = 0;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      const uint64_t len = (rng() % 4 == 0) ? 0 : 1 + rng() % 5000;
      runs.push_back({rng() % 100000, len});
      total += len;
    }
    const uint64_t chunk = 1 + rng() % 3000;
    ChunkPlan plan;
    PlanChunks(runs, chunk, &plan);
    uint64_t sum = 0;
    size_t next_piece = 0;
    uint32_t run = 0;
    uint64_t run_off = 0;
    for (size_t c = 0; c < plan.chunks.size(); ++c) {
      const Chunk& ch = plan.chunks[c];
      ASSERT_EQ(ch.first_piece, next_piece);
      ASSERT_GT(ch.bytes, 0u);
      ASSERT_LE(ch.bytes, chunk);
      if (c + 1 < plan.chunks.size()) {
        ASSERT_EQ(ch.bytes, chunk);  // only the last is short
      }
      uint64_t in_chunk = 0;
      for (size_t i = ch.first_piece; i < ch.first_piece + ch.pieces; ++i) {
        const Piece& p = plan.pieces[i];
        while (run < runs.size() && run_off == runs[run].length) {
          ++run;
          run_off = 0;
        }
        ASSERT_EQ(p.run, run);
        ASSERT_EQ(p.run_offset, run_off);
        ASSERT_EQ(p.chunk_offset, in_chunk);
        ASSERT_GT(p.length, 0u);
        in_chunk += p.length;
        run_off += p.length;
        ASSERT_LE(run_off, runs[run].length);
      }
      ASSERT_EQ(in_chunk, ch.bytes);
      sum += ch.bytes;
      next_piece += ch.pieces;
    }
    EXPECT_EQ(next_piece, plan.pieces.size());
    EXPECT_EQ(sum, total);
  }
  ChunkPlan empty;
  PlanChunks({}, 100, &empty);
  EXPECT_TRUE(empty.chunks.empty());
}

TEST(NcclWire, ModeChoice) {
  EXPECT_EQ(ChooseMode(1, 64 << 20), WireMode::kDirect);          // a contiguous layer
  EXPECT_EQ(ChooseMode(kDirectMaxRuns, 1 << 20), WireMode::kDirect);
  EXPECT_EQ(ChooseMode(1024, 1024ull * 65536), WireMode::kPack);  // scattered 64 KiB blocks
  EXPECT_EQ(ChooseMode(32, 32ull * (16 << 20)), WireMode::kDirect);  // few long runs
  EXPECT_EQ(ChooseMode(1000, 1000ull * (16 << 20)), WireMode::kPack);
}

// A refusal sent right before the peer hangs up (the receiver answering a writer on its own GPU,
// then closing) can reach the reader in the same read as the close. It must be returned, not
// reported as a disconnect: before the fix ReadFrame saw the close first and lost the frame (the
// writer got "peer closed the control socket before the hello ack" instead of the refusal).
TEST(NcclWire, ReadFrameReturnsAFrameThatArrivedWithTheClose) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  HelloAck refusal;
  refusal.code = static_cast<int32_t>(StatusCode::kFailedPrecondition);
  std::strncpy(refusal.message, "same GPU", sizeof(refusal.message) - 1);
  const std::string frame = EncodeHelloAck(refusal);
  ASSERT_EQ(::send(sv[1], frame.data(), frame.size(), 0), static_cast<ssize_t>(frame.size()));
  ::close(sv[1]);  // frame and close are both waiting before the reader looks
  std::string buf;
  auto payload = ReadFrame(sv[0], &buf, FrameType::kHelloAck, DeadlineAfterMs(2000), "hello ack");
  ASSERT_TRUE(payload.ok()) << payload.status().ToString();
  auto ack = DecodeHelloAck(payload.value());
  ASSERT_TRUE(ack.ok()) << ack.status().ToString();
  EXPECT_EQ(ack->code, static_cast<int32_t>(StatusCode::kFailedPrecondition));
  EXPECT_STREQ(ack->message, "same GPU");
  ::close(sv[0]);
}

// The other ends of ReadFrame: a close with no frame, or half a frame, is a disconnect; a frame
// of another type is data loss; silence until the deadline is a timeout.
TEST(NcclWire, ReadFrameDisconnectTimeoutAndWrongType) {
  const std::string ack = EncodeHelloAck(HelloAck{});
  for (int partial : {0, 1}) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    if (partial) {
      ASSERT_EQ(::send(sv[1], ack.data(), ack.size() / 2, 0), static_cast<ssize_t>(ack.size() / 2));
    }
    ::close(sv[1]);
    std::string buf;
    auto r = ReadFrame(sv[0], &buf, FrameType::kHelloAck, DeadlineAfterMs(2000), "hello ack");
    EXPECT_EQ(r.status().code(), StatusCode::kRemoteDisconnect) << "partial " << partial;
    ::close(sv[0]);
  }
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  std::string buf;
  const auto t0 = Clock::now();
  auto r = ReadFrame(sv[0], &buf, FrameType::kHelloAck, DeadlineAfterMs(150), "hello ack");
  EXPECT_EQ(r.status().code(), StatusCode::kTimeout);
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(140));
  ASSERT_EQ(::send(sv[1], ack.data(), ack.size(), 0), static_cast<ssize_t>(ack.size()));
  auto w = ReadFrame(sv[0], &buf, FrameType::kHello, DeadlineAfterMs(2000), "hello");
  EXPECT_EQ(w.status().code(), StatusCode::kDataLoss);
  ::close(sv[0]);
  ::close(sv[1]);
}

}  // namespace
}  // namespace kvstream::transport::nccl
