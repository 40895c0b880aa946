// The cuda_ipc control channel: a Unix-domain stream socket per endpoint that carries the
// writer's notifications to the receiver, and whose EOF tells each side that the other died.
//
// Address: "unix:<path>?token=<32 hex digits>": a filesystem socket only this user can reach
// (transport/core/private_socket.h: 0600 in a 0700 directory, the peer's uid checked with
// SO_PEERCRED on both sides; never an abstract socket) and a random 128-bit token that a writer
// learns only from the address (so from the authenticated handshake) and presents in its hello.
// Wire (version 4): the writer sends a Hello {magic "KVIPCN01", u32 version, u32 pid, u8 token[16]} then
// 32-byte frames {u64 request_id, i32 layer, i32 flags, u8 mac[16]} (host byte order: same host
// only; mac is Notification::mac, delivered unchanged); the receiver sends nothing except the
// answers to the writer's memory requests and landed-flag request (below).
//
// Guarantees:
//  - NotificationListener calls `on_notification` on its one thread, in the order the frames
//    of one connection arrive; a connection of another uid, or with a bad hello (or without
//    the token), is closed, logged and counted (refused()).
//  - Destroying the listener stops its thread and closes every socket (peers see EOF).
//  - NotificationChannel::Send never blocks longer than its send timeout; PeerClosed() never
//    blocks longer than the given timeout.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/time.h"
#include "transport/core/private_socket.h"
#include "transport/transport.h"

namespace kvstream::transport::cuda {

// Landed flags (cuda_ipc's gpu_landed_wait; transport.h kNotificationLandedOnEvent):
//  - A receiver that offers them publishes its address with the suffix "#lf"
//    (AddressWantsLandedFlags); the suffix is ignored when connecting.
//  - The writer asks once, right after the hello: frame {0, 0, kFrameFlagRequest}. The listener
//    answers with the only bytes a receiver ever sends on the socket: a grant header
//    {magic "KVIPCG01", u32 granted, u32 slot, u32 first_seq, u32 key_bytes} and key_bytes of
//    key (the backend's description of the receiver's flag array, opaque here).
//  - An early frame is {request_id, layer, kNotificationLandedOnEvent} followed by
//    {u32 seq, u32 0}: the writer's stream writes seq into its flag after the copy.
//  - The listener delivers an early frame of a granted connection as flags =
//    kNotificationLandedOnEvent | connection id (1..kLandedConnMask), landed_seq = seq; an
//    early frame from a connection without a grant is a protocol error (closed). Other frames
//    pass as sent (the transport's Write refuses user flags with bit 29 or 30).
inline constexpr int32_t kFrameFlagRequest = 1 << 29;
inline constexpr int32_t kLandedConnMask = 0x0FFFFFFF;
inline constexpr char kLandedFlagsSuffix[] = "#lf";
bool AddressWantsLandedFlags(const std::string& address);

// Memory grants (cuda_ipc's registered memory, handed over as descriptors; issue 15):
//  - The writer asks, after the hello and before any notification, with the frame
//    {id, kMemoryRequestLayer, kFrameFlagRequest} for the registration `id` its peer's key names.
//  - The listener answers with a grant header {magic "KVIPCM01", u32 granted, i32 status code,
//    u32 info_bytes, u32 0} and info_bytes of info (granted: the backend's description of the
//    memory; refused: why), in one message that carries the memory's descriptor (SCM_RIGHTS)
//    when granted. Only a connection that passed the hello (this uid by SO_PEERCRED, the
//    address's token) is ever answered: no other process can obtain a descriptor.
inline constexpr int32_t kMemoryRequestLayer = 1;  // layer 0 with kFrameFlagRequest: a flag

struct MemoryGrant {
  std::string info;  // backend-defined
  int fd = -1;       // owned by whoever holds the grant (the listener closes it once sent)
};

struct FlagGrant {
  uint32_t slot = 0;       // index of the writer's 32-bit flag in the receiver's array
  uint32_t first_seq = 1;  // the writer's first early write carries this sequence number
  std::string key;         // how the writer maps the array (backend-defined)
};

class NotificationListener {
 public:
  using Callback = std::function<void(const Notification&)>;
  // A connection (id, writer's pid from its hello) asks for a landed flag. An error: the
  // writer is told none is available (it then notifies late). Listener thread.
  using FlagRequestCallback = std::function<Result<FlagGrant>(uint32_t conn, uint32_t pid)>;
  // A connection that was granted a flag closed (EOF, error, bad frame or Drop). Listener
  // thread, after every frame that connection delivered.
  using ClosedCallback = std::function<void(uint32_t conn)>;
  // A connection asks for the memory registered as `id`. An error: the writer is told so (its
  // message) and gets no descriptor. Listener thread; must not block.
  using MemoryRequestCallback = std::function<Result<MemoryGrant>(uint32_t conn, uint64_t id)>;
  // Listens on "unix:<$TMPDIR or /tmp>/<prefix>-XXXXXX/sock?token=<hex>".
  static Result<std::unique_ptr<NotificationListener>> Start(
      const std::string& prefix, Callback on_notification,
      FlagRequestCallback on_flag_request = nullptr, ClosedCallback on_closed = nullptr,
      MemoryRequestCallback on_memory_request = nullptr);
  ~NotificationListener();
  NotificationListener(const NotificationListener&) = delete;
  NotificationListener& operator=(const NotificationListener&) = delete;
  const std::string& address() const { return address_; }
  // Connections closed before delivering anything: another uid, a bad hello, no token.
  uint64_t refused() const { return refused_.load(); }
  // Memory requests answered with a descriptor, and refused.
  uint64_t memory_granted() const { return memory_granted_.load(); }
  uint64_t memory_refused() const { return memory_refused_.load(); }
  // Closes connection `conn` soon (the writer sees EOF); on_closed follows on the listener
  // thread if it was granted a flag. Non-blocking, any thread; unknown ids are ignored.
  void Drop(uint32_t conn);

 private:
  NotificationListener() = default;
  void Run();
  void Refused(const std::string& what);  // listener thread
  // Answers connection `conn`'s request for memory `id` on `fd`; false if the answer could not
  // be sent (the connection is then closed). Listener thread.
  bool AnswerMemoryRequest(int fd, uint32_t conn, uint32_t pid, uint64_t id);

  std::string address_;
  std::unique_ptr<core::PrivateListener> socket_;
  core::Token token_{};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> memory_granted_{0}, memory_refused_{0};
  Callback callback_;
  MemoryRequestCallback on_memory_request_;
  FlagRequestCallback on_flag_request_;
  ClosedCallback on_closed_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::mutex drop_mu_;
  std::vector<uint32_t> drops_;
  std::thread thread_;
};

class NotificationChannel {
 public:
  static Result<std::unique_ptr<NotificationChannel>> Connect(const std::string& address,
                                                              Deadline deadline);
  ~NotificationChannel();
  NotificationChannel(const NotificationChannel&) = delete;
  NotificationChannel& operator=(const NotificationChannel&) = delete;
  // kRemoteDisconnect when the peer is gone.
  Status Send(const Notification& n);
  // Sends `count` notifications in order with as few socket writes as possible (one for up to
  // 64 frames): the receiver sees exactly the frames Send would have produced one by one.
  Status SendBatch(const Notification* n, size_t count);
  // Asks the receiver for a landed flag (see above); call once, before any Send. kNotSupported
  // when the receiver has none for this writer, kRemoteDisconnect / kTimeout otherwise.
  Result<FlagGrant> RequestLandedFlag(Deadline deadline);
  // Asks the receiver for the memory registered as `id` (see above); call before any Send.
  // The grant's fd is the caller's. The receiver's refusal comes back with its status code and
  // message; kRemoteDisconnect / kTimeout when it does not answer.
  Result<MemoryGrant> RequestMemory(uint64_t id, Deadline deadline);
  // An early frame for `n` (its flags are ignored) carrying `seq`.
  Status SendEarly(const Notification& n, uint32_t seq);
  // True once the peer closed or the socket failed. Waits at most timeout_us for that.
  bool PeerClosed(int64_t timeout_us) const;
  int fd() const { return fd_; }

 private:
  NotificationChannel() = default;
  // Reads exactly `n` bytes of an answer before `deadline`, collecting any descriptors that
  // come with them into `fds` (the caller closes them).
  Status ReadAnswer(void* out, size_t n, Deadline deadline, std::vector<int>* fds, const char* what);
  int fd_ = -1;
  std::mutex send_mu_;
};

}  // namespace kvstream::transport::cuda
