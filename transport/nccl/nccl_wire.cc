#include "transport/nccl/nccl_wire.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <type_traits>

#include "transport/core/socket_io.h"

namespace kvstream::transport::nccl {
namespace {

constexpr char kKeyMagic[8] = {'K', 'V', 'N', 'C', 'C', 'L', 'K', '1'};
constexpr char kAddrPrefix[] = "nccl:tcp:";

struct KeyWire {
  char magic[8];
  uint64_t registration_id;
  uint64_t length;
  int32_t device;
  int32_t pad;
  char pci_bus_id[32];
  char host_id[48];
};

struct WriteWire {
  uint64_t write_id;
  uint64_t registration_id;
  uint64_t total_bytes;
  uint32_t mode;
  uint32_t notify;
  uint64_t request_id;
  int32_t layer;
  int32_t flags;
  uint64_t runs;
  uint8_t mac[kNotificationMacBytes];  // Notification::mac, delivered unchanged
};
static_assert(sizeof(WriteWire) == 72);

template <typename T>
Result<T> DecodePod(const std::string& payload, const char* what) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (payload.size() != sizeof(T)) {
    return DataLoss(std::string("nccl: ") + what + " frame has " + std::to_string(payload.size()) +
                    " bytes, expected " + std::to_string(sizeof(T)));
  }
  T v;
  std::memcpy(&v, payload.data(), sizeof(T));
  return v;
}

std::string Hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out.push_back(d[c >> 4]);
    out.push_back(d[c & 15]);
  }
  return out;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string EncodeAddress(const Address& a) {
  return std::string(kAddrPrefix) + a.host + ":" + std::to_string(a.port) + ":" + Hex(a.unique_id);
}

Result<Address> DecodeAddress(const std::string& text) {
  const std::string prefix = kAddrPrefix;
  if (text.compare(0, prefix.size(), prefix) != 0) {
    return InvalidArgument("nccl address must look like nccl:tcp:<host>:<port>:<id>, got '" +
                           text.substr(0, 64) + "'");
  }
  const size_t id_colon = text.rfind(':');
  const size_t port_colon = id_colon == std::string::npos || id_colon == 0
                                ? std::string::npos
                                : text.rfind(':', id_colon - 1);
  if (port_colon == std::string::npos || port_colon < prefix.size()) {
    return InvalidArgument("nccl address lacks host, port or unique id: '" + text.substr(0, 64) + "'");
  }
  Address a;
  a.host = text.substr(prefix.size(), port_colon - prefix.size());
  const std::string port = text.substr(port_colon + 1, id_colon - port_colon - 1);
  const std::string id = text.substr(id_colon + 1);
  if (a.host.empty() || port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return InvalidArgument("nccl address has a bad host or port: '" + text.substr(0, 64) + "'");
  }
  const unsigned long p = std::stoul(port);
  if (p == 0 || p > 65535) return InvalidArgument("nccl address port out of range: " + port);
  a.port = static_cast<uint16_t>(p);
  if (id.size() != 2 * kUniqueIdBytes) {
    return InvalidArgument("nccl address: unique id has " + std::to_string(id.size()) +
                           " hex digits, expected " + std::to_string(2 * kUniqueIdBytes));
  }
  for (size_t i = 0; i < id.size(); i += 2) {
    const int hi = HexDigit(id[i]), lo = HexDigit(id[i + 1]);
    if (hi < 0 || lo < 0) return InvalidArgument("nccl address: unique id is not hex");
    a.unique_id.push_back(static_cast<char>(hi * 16 + lo));
  }
  return a;
}

std::string EncodeKey(const Key& k) {
  KeyWire w{};
  std::memcpy(w.magic, kKeyMagic, sizeof(kKeyMagic));
  w.registration_id = k.registration_id;
  w.length = k.length;
  w.device = k.device;
  std::memcpy(w.pci_bus_id, k.pci_bus_id, sizeof(w.pci_bus_id));
  std::memcpy(w.host_id, k.host_id, sizeof(w.host_id));
  w.pci_bus_id[sizeof(w.pci_bus_id) - 1] = 0;
  w.host_id[sizeof(w.host_id) - 1] = 0;
  return std::string(reinterpret_cast<const char*>(&w), sizeof(w));
}

Result<Key> DecodeKey(const std::string& blob) {
  if (blob.size() != sizeof(KeyWire)) {
    return InvalidArgument("nccl: remote key has " + std::to_string(blob.size()) +
                           " bytes, expected " + std::to_string(sizeof(KeyWire)) +
                           " (not an nccl key?)");
  }
  KeyWire w;
  std::memcpy(&w, blob.data(), sizeof(w));
  if (std::memcmp(w.magic, kKeyMagic, sizeof(kKeyMagic)) != 0) {
    return InvalidArgument("nccl: remote key has a bad magic (not an nccl key)");
  }
  if (w.length == 0) return InvalidArgument("nccl: remote key describes an empty region");
  Key k;
  k.registration_id = w.registration_id;
  k.length = w.length;
  k.device = w.device;
  std::memcpy(k.pci_bus_id, w.pci_bus_id, sizeof(k.pci_bus_id));
  std::memcpy(k.host_id, w.host_id, sizeof(k.host_id));
  k.pci_bus_id[sizeof(k.pci_bus_id) - 1] = 0;
  k.host_id[sizeof(k.host_id) - 1] = 0;
  return k;
}

std::string EncodeFrame(FrameType type, const void* payload, size_t bytes) {
  FrameHead h;
  h.type = static_cast<uint32_t>(type);
  h.payload = bytes;
  std::string out(sizeof(h) + bytes, '\0');
  std::memcpy(out.data(), &h, sizeof(h));
  if (bytes > 0) std::memcpy(out.data() + sizeof(h), payload, bytes);
  return out;
}

std::string EncodeHello(const Hello& h) { return EncodeFrame(FrameType::kHello, &h, sizeof(h)); }
std::string EncodeHelloAck(const HelloAck& a) {
  return EncodeFrame(FrameType::kHelloAck, &a, sizeof(a));
}
std::string EncodeAck(const Ack& a) { return EncodeFrame(FrameType::kAck, &a, sizeof(a)); }

std::string EncodeWrite(const WriteHeader& h) {
  WriteWire w{};
  w.write_id = h.write_id;
  w.registration_id = h.registration_id;
  w.total_bytes = h.total_bytes;
  w.mode = static_cast<uint32_t>(h.mode);
  w.notify = h.notify ? 1 : 0;
  w.request_id = h.notification.request_id;
  w.layer = h.notification.layer;
  w.flags = h.notification.flags;
  std::memcpy(w.mac, h.notification.mac.data(), sizeof(w.mac));
  w.runs = h.runs.size();
  const size_t run_bytes = h.runs.size() * sizeof(WireRun);
  std::string payload(sizeof(w) + run_bytes, '\0');
  std::memcpy(payload.data(), &w, sizeof(w));
  if (run_bytes > 0) std::memcpy(payload.data() + sizeof(w), h.runs.data(), run_bytes);
  return EncodeFrame(FrameType::kWrite, payload.data(), payload.size());
}

Result<bool> TakeFrame(std::string* buf, FrameType* type, std::string* payload) {
  if (buf->size() < sizeof(FrameHead)) return false;
  FrameHead h;
  std::memcpy(&h, buf->data(), sizeof(h));
  if (h.magic != kFrameMagic) return DataLoss("nccl control socket: bad frame magic");
  if (h.type < static_cast<uint32_t>(FrameType::kHello) ||
      h.type > static_cast<uint32_t>(FrameType::kAck)) {
    return DataLoss("nccl control socket: unknown frame type " + std::to_string(h.type));
  }
  if (h.payload > kMaxPayload) {
    return DataLoss("nccl control socket: frame of " + std::to_string(h.payload) +
                    " bytes exceeds the limit");
  }
  if (buf->size() - sizeof(h) < h.payload) return false;
  *type = static_cast<FrameType>(h.type);
  payload->assign(buf->data() + sizeof(h), h.payload);
  buf->erase(0, sizeof(h) + h.payload);
  return true;
}

Result<Hello> DecodeHello(const std::string& payload) {
  KV_ASSIGN_OR_RETURN(Hello h, DecodePod<Hello>(payload, "hello"));
  h.pci_bus_id[sizeof(h.pci_bus_id) - 1] = 0;
  h.host_id[sizeof(h.host_id) - 1] = 0;
  return h;
}

Result<HelloAck> DecodeHelloAck(const std::string& payload) {
  KV_ASSIGN_OR_RETURN(HelloAck a, DecodePod<HelloAck>(payload, "hello ack"));
  a.message[sizeof(a.message) - 1] = 0;
  return a;
}

Result<Ack> DecodeAck(const std::string& payload) { return DecodePod<Ack>(payload, "ack"); }

Result<WriteHeader> DecodeWrite(const std::string& payload) {
  if (payload.size() < sizeof(WriteWire)) return DataLoss("nccl: write header truncated");
  WriteWire w;
  std::memcpy(&w, payload.data(), sizeof(w));
  if (w.runs > kMaxRuns || payload.size() - sizeof(w) != w.runs * sizeof(WireRun)) {
    return DataLoss("nccl: write header announces " + std::to_string(w.runs) + " runs in " +
                    std::to_string(payload.size() - sizeof(w)) + " bytes");
  }
  if (w.mode > static_cast<uint32_t>(WireMode::kDirect)) {
    return DataLoss("nccl: write header has unknown mode " + std::to_string(w.mode));
  }
  WriteHeader h;
  h.write_id = w.write_id;
  h.registration_id = w.registration_id;
  h.total_bytes = w.total_bytes;
  h.mode = static_cast<WireMode>(w.mode);
  h.notify = w.notify != 0;
  h.notification = Notification{w.request_id, w.layer, w.flags};
  std::memcpy(h.notification.mac.data(), w.mac, sizeof(w.mac));
  h.runs.resize(w.runs);
  if (w.runs > 0) std::memcpy(h.runs.data(), payload.data() + sizeof(w), w.runs * sizeof(WireRun));
  uint64_t sum = 0;
  for (const WireRun& r : h.runs) {
    if (r.length > ~0ull - sum) return DataLoss("nccl: write header run lengths overflow");
    sum += r.length;
  }
  if (sum != h.total_bytes) {
    return DataLoss("nccl: write header total " + std::to_string(h.total_bytes) +
                    " differs from its runs' " + std::to_string(sum));
  }
  return h;
}

void PlanChunks(const std::vector<WireRun>& runs, uint64_t chunk_bytes, ChunkPlan* out) {
  out->chunks.clear();
  out->pieces.clear();
  if (chunk_bytes == 0) return;
  Chunk cur;
  for (size_t i = 0; i < runs.size(); ++i) {
    uint64_t done = 0;
    while (done < runs[i].length) {
      if (cur.bytes == chunk_bytes) {
        out->chunks.push_back(cur);
        cur = Chunk{};
        cur.first_piece = out->pieces.size();
      }
      const uint64_t n = std::min(runs[i].length - done, chunk_bytes - cur.bytes);
      out->pieces.push_back(Piece{static_cast<uint32_t>(i), done, cur.bytes, n});
      cur.bytes += n;
      cur.pieces++;
      done += n;
    }
  }
  if (cur.bytes > 0) out->chunks.push_back(cur);
}

WireMode ChooseMode(size_t runs, uint64_t total_bytes) {
  if (runs <= kDirectMaxRuns) return WireMode::kDirect;
  if (runs <= kDirectMaxRunsLong && total_bytes / runs >= kDirectMinMeanRun) return WireMode::kDirect;
  return WireMode::kPack;
}

// ---- control socket -----------------------------------------------------------------------

Result<std::string> ReadFrame(int fd, std::string* buf, FrameType want, Deadline deadline,
                              const char* what) {
  bool open = true;
  for (;;) {
    FrameType type;
    std::string payload;
    KV_ASSIGN_OR_RETURN(bool got, TakeFrame(buf, &type, &payload));
    if (got) {
      if (type != want) return DataLoss(std::string("nccl: unexpected frame while waiting for ") + what);
      return payload;
    }
    if (!open) return RemoteDisconnect(std::string("nccl: peer closed the control socket before the ") + what);
    const core::WaitResult w = core::WaitReadable(fd, deadline, 100);
    if (w == core::WaitResult::kDeadline) {
      return Timeout(std::string("nccl: no ") + what + " before the deadline");
    }
    if (w == core::WaitResult::kError) return Unavailable(std::string("nccl: poll: ") + std::strerror(errno));
    // A close can arrive in the same read as the peer's last frame: taken at the loop's top.
    if (w == core::WaitResult::kReadable) open = core::ReadAvailable(fd, buf);
  }
}

}  // namespace kvstream::transport::nccl
