#include "transport/core/envelope.h"

namespace kvstream::transport::internal {
namespace {

struct NotificationRecord {
  uint64_t request_id;
  int32_t layer;
  int32_t flags;
  uint32_t landed_seq;
  uint32_t reserved;
};
static_assert(sizeof(NotificationRecord) == 24);

std::string Named(std::string_view what) { return std::string(what); }

}  // namespace

uint32_t Fnv1a32(std::string_view bytes) {
  uint32_t h = 2166136261u;
  for (char c : bytes) h = (h ^ static_cast<uint8_t>(c)) * 16777619u;
  return h;
}

std::string SealEnvelope(const WireTag& tag, uint16_t type, std::string_view payload) {
  EnvelopeHead head{};
  std::memcpy(head.magic, tag.magic, sizeof(head.magic));
  head.version = tag.version;
  head.type = type;
  head.length = static_cast<uint32_t>(payload.size());
  head.checksum = Fnv1a32(payload);
  std::string out(sizeof(head) + payload.size(), '\0');
  std::memcpy(out.data(), &head, sizeof(head));
  if (!payload.empty()) std::memcpy(out.data() + sizeof(head), payload.data(), payload.size());
  return out;
}

Result<EnvelopeHead> ReadEnvelopeHead(const WireTag& tag, const void* bytes, uint32_t max_length,
                                      std::string_view what) {
  EnvelopeHead head;
  std::memcpy(&head, bytes, sizeof(head));
  if (std::memcmp(head.magic, tag.magic, sizeof(head.magic)) != 0) {
    return DataLoss(Named(what) + " is not a '" + std::string(tag.magic, 4) + "' message");
  }
  if (head.version != tag.version) {
    return DataLoss(Named(what) + " has wire version " + std::to_string(head.version) +
                    ", this build speaks " + std::to_string(tag.version));
  }
  if (head.length > max_length) {
    return DataLoss(Named(what) + " announces " + std::to_string(head.length) +
                    " payload bytes, more than the " + std::to_string(max_length) + " allowed");
  }
  return head;
}

Status CheckEnvelopePayload(const EnvelopeHead& head, std::string_view payload,
                            std::string_view what) {
  if (payload.size() != head.length || Fnv1a32(payload) != head.checksum) {
    return DataLoss(Named(what) + " is truncated or corrupt");
  }
  return OkStatus();
}

Result<Envelope> OpenEnvelope(const WireTag& tag, std::string_view blob, std::string_view what,
                              bool exact) {
  if (blob.size() < sizeof(EnvelopeHead)) {
    return InvalidArgument(Named(what) + " is too short to be a '" + std::string(tag.magic, 4) +
                           "' blob");
  }
  auto head = ReadEnvelopeHead(tag, blob.data(), UINT32_MAX, what);
  if (!head.ok()) return InvalidArgument(head.status().message());
  const size_t rest = blob.size() - sizeof(EnvelopeHead);
  if (head->length > rest || (exact && head->length != rest)) {
    return InvalidArgument(Named(what) + " is truncated or corrupt");
  }
  std::string_view payload = blob.substr(sizeof(EnvelopeHead), head->length);
  Status ok = CheckEnvelopePayload(*head, payload, what);
  if (!ok.ok()) return InvalidArgument(ok.message());
  return Envelope{head->type, payload};
}

PayloadWriter& PayloadWriter::Bytes(std::string_view bytes) {
  Record(static_cast<uint32_t>(bytes.size()));
  out_.append(bytes.data(), bytes.size());
  return *this;
}

bool PayloadReader::Bytes(std::string_view* bytes) {
  uint32_t n = 0;
  if (in_.size() < sizeof(n)) return false;
  std::memcpy(&n, in_.data(), sizeof(n));
  if (in_.size() - sizeof(n) < n) return false;
  *bytes = in_.substr(sizeof(n), n);
  in_.remove_prefix(sizeof(n) + n);
  return true;
}

void AppendNotification(PayloadWriter& out, const Notification& n) {
  out.Record(NotificationRecord{n.request_id, n.layer, n.flags, n.landed_seq, 0});
}

bool ReadNotification(PayloadReader& in, Notification* n) {
  NotificationRecord r;
  if (!in.Record(&r)) return false;
  *n = Notification{r.request_id, r.layer, r.flags, r.landed_seq};
  return true;
}

}  // namespace kvstream::transport::internal
