#include "connector/notification_mac.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstring>

namespace kvstream::connector {
namespace {

void Append(std::string& out, const void* p, size_t n) {
  out.append(static_cast<const char*>(p), n);
}

}  // namespace

NotificationMac ComputeNotificationMac(const std::string& secret, const std::string& session_id,
                                       uint64_t request_id, int32_t layer, uint64_t epoch) {
  // Domain, then fixed-width fields and the length-prefixed session id: no two inputs collide.
  std::string msg = "kvstream-notification-v1";
  const uint32_t id_len = static_cast<uint32_t>(session_id.size());
  Append(msg, &id_len, sizeof(id_len));
  msg += session_id;
  Append(msg, &request_id, sizeof(request_id));
  Append(msg, &layer, sizeof(layer));
  Append(msg, &epoch, sizeof(epoch));
  unsigned char full[EVP_MAX_MD_SIZE];
  unsigned int full_len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), full, &full_len);
  NotificationMac mac{};
  std::memcpy(mac.data(), full, mac.size());
  return mac;
}

bool NotificationVerifier::Verify(const transport::Notification& n) {
  const NotificationMac want =
      ComputeNotificationMac(secret_, session_id_, n.request_id, n.layer, epoch_.load());
  unsigned char diff = 0;
  for (size_t i = 0; i < want.size(); ++i) diff |= static_cast<unsigned char>(want[i] ^ n.mac[i]);
  volatile unsigned char sink = diff;
  if (sink == 0) return true;
  ++dropped_;
  return false;
}

}  // namespace kvstream::connector
