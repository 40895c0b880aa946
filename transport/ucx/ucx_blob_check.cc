#include "transport/ucx/ucx_blob_check.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include <ucs/memory/memory_type.h>

namespace kvstream::transport::ucx {
namespace {

// The UCX 1.13 wire constants (src/ucp/wireup/address.c, src/ucp/core/ucp_types.h).
constexpr unsigned kVersionV1 = 0, kVersionV2 = 1;
constexpr uint8_t kHeaderVersionMask = 0x0f;
constexpr unsigned kHeaderFlagsShiftV1 = 4;
constexpr uint8_t kHeaderDebugInfo = 1 << 0, kHeaderWorkerUuid = 1 << 1, kHeaderClientId = 1 << 2;
constexpr uint8_t kFlagLast = 0x80, kFlagHasEpAddr = 0x40, kFlagNumPaths = 0x40,
                  kFlagSysDevice = 0x20;
constexpr uint8_t kIfaceLenMask = 0x3f, kDeviceLenMask = 0x1f;
constexpr uint8_t kMdEmptyDev = 0x80, kMdMaskV1 = 0x1f, kMdMaskV2 = 0x7f;
constexpr uint8_t kNullResource = 0xff;
constexpr size_t kIfaceAttrV1 = 16, kIfaceAttrV2 = 8;  // the packed iface attribute records
constexpr unsigned kMaxResources = 128, kMaxMds = 64;
constexpr size_t kRkeyPackedDistance = 3;      // ucp_rkey_packed_distance_t

// A bounded reader: every Take fails (and stays failed) rather than read past the end.
class Cursor {
 public:
  explicit Cursor(std::string_view b) : b_(b) {}
  bool Byte(uint8_t* v) {
    if (pos_ >= b_.size()) return false;
    *v = static_cast<uint8_t>(b_[pos_++]);
    return true;
  }
  bool Peek(uint8_t* v) const {
    if (pos_ >= b_.size()) return false;
    *v = static_cast<uint8_t>(b_[pos_]);
    return true;
  }
  bool Skip(size_t n) {
    if (b_.size() - pos_ < n) return false;
    pos_ += n;
    return true;
  }
  bool U64(uint64_t* v) {
    if (b_.size() - pos_ < sizeof(*v)) return false;
    std::memcpy(v, b_.data() + pos_, sizeof(*v));
    pos_ += sizeof(*v);
    return true;
  }
  bool Take(size_t n, std::string_view* out) {
    if (b_.size() - pos_ < n) return false;
    *out = b_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == b_.size(); }
  size_t left() const { return b_.size() - pos_; }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};

// ucp_address_unpack_byte_extended: a value under `mask`, or (V2) `mask` and the value next.
bool Extended(Cursor& c, uint8_t mask, unsigned version, uint8_t* value) {
  uint8_t b;
  if (!c.Byte(&b)) return false;
  *value = b & mask;
  if (version != kVersionV1 && *value == mask) return c.Byte(value);
  return true;
}

// ucp_address_packed_iface_attr_t: float overhead (s), bandwidth (B/s), lat_ovh (s), then flags.
bool SaneV1Attributes(std::string_view a) {
  float v[3];
  std::memcpy(v, a.data(), sizeof(v));
  const float limits[3] = {1.0f, 1e15f, 1.0f};
  for (int i = 0; i < 3; ++i) {
    if (!std::isfinite(v[i]) || v[i] < 0 || v[i] > limits[i]) return false;
  }
  return v[1] > 0;
}

Status Bad(const std::string& what, const std::string& why) {
  return InvalidArgument(what + " is not a UCX worker address this build can read: " + why);
}

}  // namespace

Status CheckWorkerAddress(std::string_view address, const std::string& what) {
  if (address.empty()) return Bad(what, "empty");
  if (address.size() > kMaxWorkerAddressBytes) {
    return Bad(what, std::to_string(address.size()) + " bytes, more than the " +
                         std::to_string(kMaxWorkerAddressBytes) + " allowed");
  }
  Cursor c(address);
  uint8_t head = 0, flags = 0;
  c.Byte(&head);
  const unsigned version = head & kHeaderVersionMask;
  if (version == kVersionV1) {
    flags = head >> kHeaderFlagsShiftV1;
  } else if (version == kVersionV2) {
    if (!c.Byte(&flags)) return Bad(what, "cut short in its header");
  } else {
    return Bad(what, "address version " + std::to_string(version));
  }
  // The default unpack flags of ucp_ep_create: worker uuid and name.
  if ((version == kVersionV1 || (flags & kHeaderWorkerUuid)) && !c.Skip(8)) {
    return Bad(what, "cut short in its worker id");
  }
  if ((flags & kHeaderClientId) && !c.Skip(8)) return Bad(what, "cut short in its client id");
  if (flags & kHeaderDebugInfo) {
    uint8_t n;
    if (!c.Byte(&n) || !c.Skip(n)) return Bad(what, "cut short in its worker name");
  }
  uint8_t first;
  if (!c.Peek(&first)) return Bad(what, "no device list");
  if (first == kNullResource) return Bad(what, "no transport at all");
  const uint8_t md_mask = version == kVersionV1 ? kMdMaskV1 : kMdMaskV2;
  unsigned entries = 0, devices = 0;
  for (bool last_dev = false; !last_dev;) {
    if (++devices > kMaxResources) return Bad(what, "more devices than UCX handles");
    uint8_t md_byte, md_index;
    if (!c.Peek(&md_byte) || !Extended(c, md_mask, version, &md_index)) {
      return Bad(what, "cut short in a device");
    }
    if (md_index >= kMaxMds) return Bad(what, "memory domain index " + std::to_string(md_index));
    uint8_t dev_byte, dev_len;
    if (!c.Peek(&dev_byte) || !Extended(c, kDeviceLenMask, version, &dev_len)) {
      return Bad(what, "cut short in a device address length");
    }
    last_dev = dev_byte & kFlagLast;
    if (dev_byte & kFlagNumPaths) {
      uint8_t paths;
      if (!c.Byte(&paths)) return Bad(what, "cut short in a device's path count");
      if (paths == 0) return Bad(what, "a device with no path");
    }
    if ((dev_byte & kFlagSysDevice) && !c.Skip(1)) return Bad(what, "cut short in a device id");
    if (!c.Skip(dev_len)) return Bad(what, "cut short in a device address");
    for (bool last_tl = md_byte & kMdEmptyDev; !last_tl;) {
      if (++entries > kMaxResources) return Bad(what, "more interfaces than UCX handles");
      const size_t attr = version == kVersionV1 ? kIfaceAttrV1 : kIfaceAttrV2;
      std::string_view attrs;
      if (!c.Skip(2) || !c.Take(attr, &attrs)) return Bad(what, "cut short in an interface");
      // UCX scores lanes from these and asserts on a negative score: V1 carries them as
      // floats (overhead, bandwidth, latency overhead), V2 as fp8 codes that are always sane.
      if (version == kVersionV1 && !SaneV1Attributes(attrs)) {
        return Bad(what, "an interface's performance figures are not finite and positive");
      }
      uint8_t len_byte, iface_len;
      if (!c.Peek(&len_byte) || !Extended(c, kIfaceLenMask, version, &iface_len)) {
        return Bad(what, "cut short in an interface address length");
      }
      last_tl = len_byte & kFlagLast;
      if (len_byte & kFlagHasEpAddr) return Bad(what, "endpoint addresses in a worker address");
      if (!c.Skip(iface_len)) return Bad(what, "cut short in an interface address");
    }
  }
  if (!c.done()) return Bad(what, std::to_string(c.left()) + " bytes after its last device");
  return OkStatus();
}

Status CheckPackedRkey(std::string_view rkey, const std::string& what) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument(what + " is not a UCX memory key this build can read: " + why);
  };
  if (rkey.size() > kMaxPackedRkeyBytes) {
    return bad(std::to_string(rkey.size()) + " bytes, more than the " +
               std::to_string(kMaxPackedRkeyBytes) + " allowed");
  }
  Cursor c(rkey);
  uint64_t md_map;
  uint8_t mem_type;
  if (!c.U64(&md_map) || !c.Byte(&mem_type)) return bad("cut short in its header");
  if (md_map == 0) return bad("no memory domain");
  if (mem_type >= UCS_MEMORY_TYPE_LAST) return bad("memory type " + std::to_string(mem_type));
  for (uint64_t m = md_map; m != 0; m &= m - 1) {
    uint8_t n;
    if (!c.Byte(&n) || !c.Skip(n)) return bad("cut short in a memory domain's key");
  }
  // Then nothing, or a system device and its distances (ucp_rkey_pack_common).
  if (!c.done() && (c.left() - 1) % kRkeyPackedDistance != 0) {
    return bad(std::to_string(c.left()) + " bytes after its keys");
  }
  return OkStatus();
}

}  // namespace kvstream::transport::ucx
