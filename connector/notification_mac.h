// Notification MACs: what makes a layer notification count at the decode (issue 15, item 2).
//
// The prefill tags every notification with HMAC-SHA256 over (session id, request id, layer,
// epoch), keyed by the session secret of the decode's handshake and cut to
// transport::kNotificationMacBytes; the secret itself never travels on the data plane. The
// decode drops, and counts, a notification whose tag does not verify: forged (no secret), from
// another session or another epoch (a link of an earlier handshake: late or replayed), or a
// genuine tag moved onto another request or layer.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "transport/transport.h"

namespace kvstream::connector {

using NotificationMac = std::array<uint8_t, transport::kNotificationMacBytes>;

NotificationMac ComputeNotificationMac(const std::string& secret, const std::string& session_id,
                                       uint64_t request_id, int32_t layer, uint64_t epoch);

// The decode's check. Thread-safe: the epoch changes at each handshake while the transport's
// thread checks.
class NotificationVerifier {
 public:
  NotificationVerifier(std::string secret, std::string session_id)
      : secret_(std::move(secret)), session_id_(std::move(session_id)) {}
  // The epoch of the handshake whose link may notify from now on.
  void set_epoch(uint64_t epoch) { epoch_.store(epoch); }
  uint64_t epoch() const { return epoch_.load(); }
  // True when n's tag is the current epoch's for its request and layer (constant-time
  // comparison); false is counted in dropped().
  bool Verify(const transport::Notification& n);
  uint64_t dropped() const { return dropped_.load(); }

 private:
  const std::string secret_;
  const std::string session_id_;
  std::atomic<uint64_t> epoch_{0};
  std::atomic<uint64_t> dropped_{0};
};

}  // namespace kvstream::connector
