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

class NotificationListener {
 public:
  using Callback = std::function<void(const Notification&)>;
  // Listens on "unix:@<prefix>.<pid>.<counter>".
  static Result<std::unique_ptr<NotificationListener>> Start(const std::string& prefix,
                                                             Callback on_notification);
  ~NotificationListener();
  NotificationListener(const NotificationListener&) = delete;
  NotificationListener& operator=(const NotificationListener&) = delete;
  const std::string& address() const { return address_; }

 private:
  NotificationListener() = default;
  void Run();

  std::string address_;
  Callback callback_;
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
  // True once the peer closed or the socket failed. Waits at most timeout_us for that.
  bool PeerClosed(int64_t timeout_us) const;
  int fd() const { return fd_; }

 private:
  NotificationChannel() = default;
  int fd_ = -1;
  std::mutex send_mu_;
};

}  // namespace kvstream::transport::cuda
