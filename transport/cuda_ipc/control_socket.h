// The cuda_ipc control channel: a Unix-domain stream socket per endpoint that carries the
// writer's notifications to the receiver, and whose EOF tells each side that the other died.
//
// Address forms: "unix:@name" (Linux abstract namespace, nothing on disk) or "unix:/path".
// Wire: the writer sends a Hello {magic "KVIPCN01", version} then 16-byte frames
// {u64 request_id, i32 layer, i32 flags} (host byte order: same host only).
//
// Guarantees:
//  - NotificationListener calls `on_notification` on its one thread, in the order the frames
//    of one connection arrive; a connection with a bad hello is closed and logged.
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

#include "common/status.h"
#include "common/time.h"
#include "transport/transport.h"

namespace kvstream::transport::cuda {

// Early notifications (cuda_ipc's gpu_landed_wait; transport.h kNotificationLandedOnEvent):
//  - A receiver that wants them publishes its address with the suffix "#ev"
//    (AddressWantsLandedEvents); the suffix is ignored when connecting.
//  - The writer then sends its event table once, right after the hello: a frame
//    {0, count, kFrameEventTable} followed by count * kEventHandleBytes bytes (one
//    cudaIpcEventHandle_t each), and marks early frames with kNotificationLandedOnEvent | slot.
//  - The listener rewrites such a frame's flags (on connections that sent a table; others'
//    frames pass unchanged) to kNotificationLandedOnEvent |
//    connection id << kLandedConnShift | slot, its connection ids being 1..65535, so that the
//    receiver finds the event of (connection, slot) in the table that connection sent.
inline constexpr int32_t kFrameEventTable = 1 << 29;
inline constexpr size_t kEventHandleBytes = 64;
inline constexpr int32_t kLandedSlotMask = 0xFFF;
inline constexpr int kLandedConnShift = 12;
inline constexpr int32_t kLandedConnMask = 0xFFFF;
inline constexpr char kLandedEventsSuffix[] = "#ev";
bool AddressWantsLandedEvents(const std::string& address);

class NotificationListener {
 public:
  using Callback = std::function<void(const Notification&)>;
  // (connection id, table bytes): a connection's event table arrived; empty bytes: that
  // connection (which had sent a table) closed. Called on the listener thread, in order with
  // the connection's notifications.
  using EventsCallback = std::function<void(uint32_t, const std::string&)>;
  // Listens on "unix:@<prefix>.<pid>.<counter>".
  static Result<std::unique_ptr<NotificationListener>> Start(const std::string& prefix,
                                                             Callback on_notification,
                                                             EventsCallback on_events = nullptr);
  ~NotificationListener();
  NotificationListener(const NotificationListener&) = delete;
  NotificationListener& operator=(const NotificationListener&) = delete;
  const std::string& address() const { return address_; }

 private:
  NotificationListener() = default;
  void Run();

  std::string address_;
  Callback callback_;
  EventsCallback on_events_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
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
  // The event table of early notifications (see above): `handles` holds whole
  // kEventHandleBytes-sized handles, at most kLandedSlotMask + 1 of them.
  Status SendEventTable(const std::string& handles);
  // True once the peer closed or the socket failed. Waits at most timeout_us for that.
  bool PeerClosed(int64_t timeout_us) const;
  int fd() const { return fd_; }

 private:
  NotificationChannel() = default;
  int fd_ = -1;
  std::mutex send_mu_;
};

}  // namespace kvstream::transport::cuda
