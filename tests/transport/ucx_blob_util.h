// Test helpers for altering the UCX backend's blobs as an attacker would: the UCX part (the
// last length-prefixed string of a key payload: UCX's packed rkey) or a whole payload read or
// replaced, and the blob sealed again with its own tag and type.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "transport/core/envelope.h"

namespace kvstream::transport::test {

// The blob's own tag (magic and version), whatever version this build speaks.
inline internal::WireTag TagOf(const std::string& blob) {
  internal::WireTag tag{};
  if (blob.size() < 6) return tag;
  std::memcpy(tag.magic, blob.data(), 4);
  std::memcpy(&tag.version, blob.data() + 4, 2);
  return tag;
}

// Offset of the UCX part's length prefix in `payload`, or npos.
inline size_t UcxPartOffset(const std::string& payload) {
  for (size_t o = 0; o + 4 <= payload.size(); o += 4) {
    uint32_t n;
    std::memcpy(&n, payload.data() + o, 4);
    if (n != 0 && o + 4 + n == payload.size()) return o;
  }
  return std::string::npos;
}

// The UCX part of `blob` ("" when there is none).
inline std::string UcxPart(const std::string& blob) {
  auto e = internal::OpenEnvelope(TagOf(blob), blob, "test blob");
  if (!e.ok()) return "";
  const std::string payload(e->payload);
  const size_t o = UcxPartOffset(payload);
  return o == std::string::npos ? "" : payload.substr(o + 4);
}

// `blob` with its UCX part replaced by `ucx` and sealed again (unchanged when it has none).
inline std::string WithUcxPart(const std::string& blob, const std::string& ucx) {
  const internal::WireTag tag = TagOf(blob);
  auto e = internal::OpenEnvelope(tag, blob, "test blob");
  if (!e.ok()) return blob;
  const std::string payload(e->payload);
  const size_t o = UcxPartOffset(payload);
  if (o == std::string::npos) return blob;
  std::string out = payload.substr(0, o);
  const uint32_t len = static_cast<uint32_t>(ucx.size());
  out.append(reinterpret_cast<const char*>(&len), 4);
  out += ucx;
  return internal::SealEnvelope(tag, e->type, out);
}

// The whole payload of `blob` ("" when it is not an envelope) and `blob` sealed again around
// another payload (the address carries no UCX part: a listener's socket address).
inline std::string PayloadOf(const std::string& blob) {
  auto e = internal::OpenEnvelope(TagOf(blob), blob, "test blob");
  return e.ok() ? std::string(e->payload) : "";
}
inline std::string WithPayload(const std::string& blob, const std::string& payload) {
  auto e = internal::OpenEnvelope(TagOf(blob), blob, "test blob");
  return e.ok() ? internal::SealEnvelope(TagOf(blob), e->type, payload) : blob;
}

}  // namespace kvstream::transport::test
