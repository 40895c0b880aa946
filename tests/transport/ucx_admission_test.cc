// UCX connections go through a ucp_listener that admits only the writer the control plane
// named (issue 15, item 3): a raw UCX client (ucx_raw_client, ucp alone) that connects to a
// receiver's listener and puts into its registered memory, even with the memory key and the
// genuine writer's client id, is refused and nothing lands; the admitted writer's data does.
// And an admitted client's hostile data messages land nowhere outside registered memory.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/fault_record.h"
#include "tests/transport/test_util.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_transport.h"
#include "transport/ucx/ucx_wire.h"

namespace kvstream::transport {
namespace {

using kvstream::testing::FaultOutcome;
using kvstream::testing::RecordFault;

constexpr size_t kBytes = 64 << 10;

struct Attack {
  int exit_code = -1;  // ucx_raw_client's: 0 refused, 1 landed, 3 no answer
  std::string result;
};

// Runs the raw client against `listener` (client id 0 = random).
Attack RawPut(const ucx::WireSockAddr& listener, uint64_t client_id, uint64_t target,
              const std::string& packed_rkey, size_t bytes) {
  const std::string addr = ucx::ToString(listener);
  const std::string ip = addr.substr(0, addr.rfind(':'));
  std::ostringstream cmd;
  cmd << KVSTREAM_UCX_RAW_CLIENT_BIN << " " << ip << " " << listener.port << " " << std::hex
      << client_id << std::dec << " " << target << " "
      << (packed_rkey.empty()                 ? std::string("-")
          : packed_rkey.rfind("am:", 0) == 0 ? packed_rkey  // a data message (header in hex)
                                              : test::ToHex(packed_rkey))
      << " " << bytes << " 2>&1";
  Attack a;
  FILE* p = popen(cmd.str().c_str(), "r");
  if (p == nullptr) return a;
  char line[512];
  while (std::fgets(line, sizeof(line), p) != nullptr) {
    std::string s(line);
    if (s.rfind("RESULT ", 0) == 0) a.result = s.substr(7, s.find('\n') - 7);
  }
  const int status = pclose(p);
  a.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return a;
}

class UcxAdmission : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto rx = CreateTransport(test::Options("ucx", GetParam()));
    ASSERT_TRUE(rx.ok()) << rx.status().ToString();
    auto tx = CreateTransport(test::Options("ucx", GetParam()));
    ASSERT_TRUE(tx.ok()) << tx.status().ToString();
    rx_ = std::move(rx).value();
    tx_ = std::move(tx).value();
    auto d = rx_->Register(MemoryRegion{dst_.data(), kBytes});
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    dst_reg_ = std::move(d).value();
    auto s = tx_->Register(MemoryRegion{src_.data(), kBytes});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    src_reg_ = std::move(s).value();
    peer_.address = rx_->LocalAddress();
    peer_.regions.push_back(
        {reinterpret_cast<uint64_t>(dst_.data()), kBytes, dst_reg_->RemoteKey()});
    auto a = ucx::DecodeAddress(peer_.address);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    listener_ = a->listener;
    rx_->SetNotificationSink([this](const Notification& n) { notes_.Push(n); });
  }
  void TearDown() override {
    if (rx_) rx_->SetNotificationSink(nullptr);
  }

  // Every byte of the receiver's region still 0.
  size_t Changed() const {
    size_t n = 0;
    for (uint8_t b : dst_) n += b != 0;
    return n;
  }

  Status WriteLayer(Endpoint& ep, uint64_t seed) {
    test::FillPattern(src_.data(), kBytes, seed);
    WriteRequest r;
    r.local = src_reg_.get();
    r.ops.push_back(CopyOp{0, 0, kBytes});
    r.notify = true;
    r.notification = Notification{seed, 0, 0};
    auto h = ep.Write(r);
    if (!h.ok()) return h.status();
    return (*h)->Wait(DeadlineAfterMs(20000));
  }

  std::unique_ptr<Transport> rx_, tx_;
  std::vector<uint8_t> dst_ = std::vector<uint8_t>(kBytes, 0);
  std::vector<uint8_t> src_ = std::vector<uint8_t>(kBytes, 0);
  std::unique_ptr<Registration> dst_reg_, src_reg_;
  PeerDescriptor peer_;
  ucx::WireSockAddr listener_;
  test::NotificationQueue notes_;
};

TEST_P(UcxAdmission, RawClientIsRefusedAndItsPutsNeverLand) {
  const uint64_t target = reinterpret_cast<uint64_t>(dst_.data());
  // A stranger with the memory key (as if leaked), then one with a key of its own memory.
  Attack leaked = RawPut(listener_, 0, target, dst_reg_->RemoteKey(), kBytes);
  EXPECT_EQ(leaked.exit_code, 0) << "raw client with the memory key: " << leaked.result;
  Attack own = RawPut(listener_, 0, target, "", kBytes);
  EXPECT_EQ(own.exit_code, 0) << "raw client with its own key: " << own.result;
  EXPECT_EQ(Changed(), 0u) << "a refused client's put landed";
  EXPECT_GE(rx_->counters().connections_refused, 2u);
  EXPECT_EQ(rx_->counters().connections_admitted, 0u);

  // The genuine writer, admitted: while its connection is open, a client that presents the
  // same client id (seen on the wire) from another socket is refused too.
  auto ep = test::ConnectAdmitted(*tx_, *rx_, peer_);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  ASSERT_TRUE(WriteLayer(**ep, 7).ok());
  Notification n;
  ASSERT_TRUE(notes_.Pop(&n, DeadlineAfterMs(10000)));
  EXPECT_EQ(n.request_id, 7u);
  EXPECT_TRUE(test::CheckPattern(dst_.data(), kBytes, 7));
  auto ticket = ucx::DecodeTicket((*ep)->AdmissionTicket());
  ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
  // The ticket was used up by the genuine connection; even re-admitting it names only the
  // genuine writer's socket, which the spoofer cannot connect from.
  ASSERT_TRUE(rx_->Admit((*ep)->AdmissionTicket()).ok());
  Attack spoof = RawPut(listener_, ticket->client_id, target, dst_reg_->RemoteKey(), kBytes);
  EXPECT_EQ(spoof.exit_code, 0) << "raw client with the writer's client id: " << spoof.result;
  EXPECT_TRUE(test::CheckPattern(dst_.data(), kBytes, 7)) << "the spoofer's put landed";
  EXPECT_EQ(rx_->counters().connections_admitted, 1u);
  EXPECT_GE(rx_->counters().connections_refused, 3u);
  ASSERT_TRUE(WriteLayer(**ep, 8).ok()) << "the admitted writer stopped working";
  EXPECT_TRUE(test::CheckPattern(dst_.data(), kBytes, 8));

  FaultOutcome o;
  o.tries = 3;
  o.aborts = 0;
  o.bytes_outside = 0;
  o.outcome = "UCX_TLS " + (GetParam().empty() ? std::string("default") : GetParam()) +
              ": refused at the listener (" + leaked.result + "), nothing landed; the admitted "
              "writer's layers landed";
  RecordFault("data.raw_ucx_client",
              "a raw UCX client connecting to the receiver's listener and putting into its "
              "registered memory (with the leaked memory key, with its own key, and with the "
              "admitted writer's client id)",
              o);
}

// A connection that no Admit() named before it arrived is refused; its writes fail.
TEST_P(UcxAdmission, UnadmittedWriterIsRefused) {
  auto ep = tx_->Connect(peer_);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  Status s = WriteLayer(**ep, 9);
  EXPECT_FALSE(s.ok()) << "a write through a connection nobody admitted completed";
  // On one host with shared memory allowed, the writer proved itself at the same-host gate with
  // the token of the (authenticated) handshake and copies directly; only its notification
  // needs the UCX connection. Over TCP alone nothing lands.
  if (GetParam() == "tcp") {
    EXPECT_EQ(Changed(), 0u);
  }
  EXPECT_GE(rx_->counters().connections_refused, 1u);
  Notification n;
  EXPECT_FALSE(notes_.Pop(&n, DeadlineAfterMs(100)));
  // Tickets that are not UCX's are refused.
  EXPECT_EQ(rx_->Admit("junk").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rx_->Admit("").code(), StatusCode::kInvalidArgument);
}

// The receiver answers over the connection it admitted (ucx::ReplyEndpoint, what ucx_staged's
// credits use): the writer gets the notifications without accepting any connection itself.
TEST_P(UcxAdmission, RepliesGoBackOverTheAdmittedConnection) {
  test::NotificationQueue replies;
  tx_->SetNotificationSink([&replies](const Notification& n) { replies.Push(n); });
  auto ep = tx_->Connect(peer_);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  const std::string ticket = (*ep)->AdmissionTicket();
  // No connection yet (nothing admitted, nothing written): nothing to reply over.
  EXPECT_EQ(ucx::ReplyEndpoint(*rx_, ticket).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(ucx::ReplyEndpoint(*rx_, "junk").status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(rx_->Admit(ticket).ok());
  ASSERT_TRUE(WriteLayer(**ep, 11).ok());
  Notification n;
  ASSERT_TRUE(notes_.Pop(&n, DeadlineAfterMs(10000)));
  auto reply = ucx::ReplyEndpoint(*rx_, ticket);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  for (uint64_t i = 1; i <= 3; ++i) {
    WriteRequest r;
    r.local = dst_reg_.get();
    r.notify = true;
    r.notification = Notification{100 + i, int32_t(i), 5};
    auto h = (*reply)->Write(r);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    ASSERT_TRUE((*h)->Wait(DeadlineAfterMs(10000)).ok());
    ASSERT_TRUE(replies.Pop(&n, DeadlineAfterMs(10000)));
    EXPECT_EQ(n.request_id, 100 + i);
    EXPECT_EQ(n.layer, int32_t(i));
  }
  // Copies are refused: a reply endpoint names no memory of the writer.
  WriteRequest copy;
  copy.local = dst_reg_.get();
  copy.ops.push_back(CopyOp{0, 0, 64});
  EXPECT_EQ((*reply)->Write(copy).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tx_->counters().connections_admitted, 0u) << "the writer accepted a connection";
  // The writer goes away: its connection closes, and the reply endpoint fails.
  ep->reset();
  const Deadline deadline = DeadlineAfterMs(10000);
  Status s;
  while (!Expired(deadline)) {
    WriteRequest r;
    r.local = dst_reg_.get();
    r.notify = true;
    auto h = (*reply)->Write(r);
    s = h.ok() ? (*h)->Wait(DeadlineAfterMs(2000)) : h.status();
    if (!s.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(s.ok()) << "replies still went out after the writer's connection closed";
  while (!Expired(deadline) && (*reply)->status().ok()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ((*reply)->status().code(), StatusCode::kRemoteDisconnect);
  reply->reset();
  tx_->SetNotificationSink(nullptr);
}

// Data messages (how CUDA memory moves: ucx_writer.h) from an admitted but hostile writer land
// only inside memory the receiver registered: a header naming memory around or outside the
// registration, a length other than the bytes carried, an address range that wraps, or no
// header at all is dropped (logged), and the receiver keeps serving; a message inside lands.
TEST(UcxDataMessages, HostileHeadersNeverWriteOutsideRegisteredMemory) {
  TransportOptions o = test::Options("ucx", "tcp");
  o.ucx.admit_any = true;  // the attacker is admitted: what it sends is the question here
  auto rx = CreateTransport(o);
  ASSERT_TRUE(rx.ok()) << rx.status().ToString();
  // Three 64 KiB thirds; only the middle one is registered.
  std::vector<uint8_t> mem(3 * kBytes, 0);
  const uint64_t reg_at = reinterpret_cast<uint64_t>(mem.data()) + kBytes;
  auto reg = (*rx)->Register(MemoryRegion{mem.data() + kBytes, kBytes});
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  auto a = ucx::DecodeAddress((*rx)->LocalAddress());
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto header = [](uint64_t addr, uint64_t length) {
    return ucx::EncodeDataHeader(ucx::UcxDataHeader{addr, length});
  };
  struct Case {
    const char* what;
    std::string header;
    size_t bytes;
  };
  const std::vector<Case> hostile = {
      {"straddling the registration's start", header(reg_at - 4096, 8192), 8192},
      {"straddling its end", header(reg_at + kBytes - 4096, 8192), 8192},
      {"memory the receiver did not register", header(reg_at - kBytes, 4096), 4096},
      {"a header announcing more than it carries", header(reg_at, 8192), 4096},
      {"a header announcing less than it carries", header(reg_at, 4096), 8192},
      {"an address range that wraps", header(~uint64_t{0} - 4095, 8192), 8192},
      {"garbage for a header", std::string(40, '\x5a'), 4096},
  };
  std::string outcomes;
  for (const Case& c : hostile) {
    Attack at = RawPut(a->listener, 0, 0, "am:" + test::ToHex(c.header), c.bytes);
    EXPECT_TRUE(at.exit_code == 0 || at.exit_code == 1) << c.what << ": " << at.result;
    size_t changed = 0;
    for (uint8_t b : mem) changed += b != 0;
    EXPECT_EQ(changed, 0u) << c.what << ": bytes landed";
  }
  // One message inside the registration lands, and only there.
  Attack inside = RawPut(a->listener, 0, 0, "am:" + test::ToHex(header(reg_at + 4096, 4096)), 4096);
  EXPECT_EQ(inside.exit_code, 1) << inside.result;
  const Deadline deadline = DeadlineAfterMs(5000);
  while (mem[kBytes + 4096] != 0xAB && !Expired(deadline)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (size_t i = 0; i < mem.size(); ++i) {
    const bool in = i >= kBytes + 4096 && i < kBytes + 8192;
    ASSERT_EQ(mem[i], in ? 0xAB : 0) << "byte " << i;
  }
  FaultOutcome f;
  f.tries = static_cast<int>(hostile.size());
  f.aborts = 0;
  f.bytes_outside = 0;
  f.outcome = "each dropped by the receiver, nothing landed outside the registration; a message "
              "inside it landed afterwards";
  RecordFault("data.hostile_ucx_data_messages",
              "an admitted raw UCX client's data messages (active-message rendezvous, how CUDA "
              "memory moves) naming memory around or outside the registration, lengths that "
              "disagree with the bytes, a wrapping range, a garbage header",
              f);
}

INSTANTIATE_TEST_SUITE_P(Ucx, UcxAdmission, ::testing::Values("tcp", "sm,tcp", ""),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param.empty() ? std::string("default")
                                  : info.param == "tcp" ? std::string("tcp")
                                                        : std::string("sm_tcp");
                         });

}  // namespace
}  // namespace kvstream::transport
