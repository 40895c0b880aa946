#include "transport/options.h"

#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>

namespace kvstream::transport {
namespace {

using Setter = std::function<Status(TransportOptions&, std::string_view)>;
struct Key {
  TransportOptionKey key;
  Setter set;
};

Status Bad(std::string_view key, std::string_view value, std::string_view want) {
  return InvalidArgument(std::string(key) + ": expected " + std::string(want) + ", got '" +
                         std::string(value) + "'");
}

template <class T>
bool ParseInt(std::string_view v, T* out) {
  if (v.empty()) return false;
  auto r = std::from_chars(v.data(), v.data() + v.size(), *out);
  return r.ec == std::errc() && r.ptr == v.data() + v.size();
}

bool ParseDouble(std::string_view v, double* out) {
  if (v.empty()) return false;
  const std::string s(v);
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(*out);
}

bool ParseBool(std::string_view v, bool* out) {
  if (v == "true" || v == "1" || v == "on" || v == "yes") return *out = true, true;
  if (v == "false" || v == "0" || v == "off" || v == "no") return *out = false, true;
  return false;
}

Setter Text(std::string TransportOptions::*field) {
  return [field](TransportOptions& o, std::string_view v) {
    o.*field = std::string(v);
    return OkStatus();
  };
}

template <class T>
Setter Integer(const char* name, T lo, T hi, std::function<void(TransportOptions&, T)> store) {
  return [=](TransportOptions& o, std::string_view v) {
    T x{};
    if (!ParseInt(v, &x) || x < lo || x > hi) {
      return Bad(name, v, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    store(o, x);
    return OkStatus();
  };
}

Setter NonNegative(const char* name, std::function<double&(TransportOptions&)> field) {
  return [=](TransportOptions& o, std::string_view v) {
    double x = 0;
    if (!ParseDouble(v, &x) || x < 0) return Bad(name, v, "a number >= 0");
    field(o) = x;
    return OkStatus();
  };
}

Setter Flag(const char* name, std::function<bool&(TransportOptions&)> field) {
  return [=](TransportOptions& o, std::string_view v) {
    bool b = false;
    if (!ParseBool(v, &b)) return Bad(name, v, "true|false");
    field(o) = b;
    return OkStatus();
  };
}

template <class E>
Setter Choice(const char* name, std::vector<std::pair<std::string_view, E>> words,
              std::function<E&(TransportOptions&)> field) {
  std::string want;
  for (const auto& [w, e] : words) want += (want.empty() ? "" : "|") + std::string(w);
  return [=](TransportOptions& o, std::string_view v) {
    for (const auto& [w, e] : words) {
      if (v == w) {
        field(o) = e;
        return OkStatus();
      }
    }
    return Bad(name, v, want);
  };
}

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

const std::vector<Key>& Keys() {
  static const std::vector<Key> keys = {
      {{"transport", "data plane: ucx | ucx_staged | cuda_ipc | nccl (GPU pools: ucx = direct or "
                     "staged)"},
       Text(&TransportOptions::backend)},
      {{"ucx_tls", "UCX transports, e.g. tcp, sm (empty = UCX default / $UCX_TLS)"},
       [](TransportOptions& o, std::string_view v) {
         o.ucx.tls = std::string(v);
         return OkStatus();
       }},
      {{"ucx_net_devices", "UCX network devices, e.g. lo (empty = UCX default)"},
       [](TransportOptions& o, std::string_view v) {
         o.ucx.net_devices = std::string(v);
         return OkStatus();
       }},
      {{"ucx_same_host_copy",
        "ucx: copy into a same-host peer's memory directly (true|false; false = UCX puts)", true},
       Flag("ucx_same_host_copy", [](TransportOptions& o) -> bool& { return o.ucx.same_host_copy; })},
      {{"ucx_copy_lanes", "ucx: threads per same-host write (0 = half the cores, up to 8)"},
       Integer<int>("ucx_copy_lanes", 0, 32, [](TransportOptions& o, int n) { o.ucx.copy_lanes = n; })},
      {{"staged_zero_copy",
        "ucx_staged: auto | off (off = UCX puts into the peer's slots also on one host)"},
       Choice<staged::ZeroCopy>("staged_zero_copy",
                                {{"auto", staged::ZeroCopy::kAuto}, {"off", staged::ZeroCopy::kOff}},
                                [](TransportOptions& o) -> staged::ZeroCopy& { return o.staged.zero_copy; })},
      {{"staged_chunk_mib", "ucx_staged: largest chunk (one staging slot), MiB"},
       Integer<uint64_t>("staged_chunk_mib", 1, 256,
                         [](TransportOptions& o, uint64_t n) { o.staged.chunk_bytes = n << 20; })},
      {{"staged_fill_kib", "ucx_staged: per-write chunk size constant, KiB (0 = largest chunks)"},
       Integer<uint64_t>("staged_fill_kib", 0, 65536, [](TransportOptions& o, uint64_t n) {
         o.staged.adaptive_chunk_fill = n << 10;
       })},
      {{"pace_bytes_per_s", "prefill: KV write rate limit, bytes/s (0 = unlimited)"},
       NonNegative("pace_bytes_per_s", [](TransportOptions& o) -> double& { return o.pacing.bytes_per_s; })},
      {{"pace_burst_bytes", "prefill: burst the rate limit allows (0 = 2 chunks)"},
       Integer<uint64_t>("pace_burst_bytes", 0, kU64Max,
                         [](TransportOptions& o, uint64_t n) { o.pacing.burst_bytes = n; })},
      {{"pace_chunk_bytes", "prefill: pacing chunk (0 = 1 ms of the rate)"},
       Integer<uint64_t>("pace_chunk_bytes", 0, kU64Max,
                         [](TransportOptions& o, uint64_t n) { o.pacing.chunk_bytes = n; })},
      {{"itl_target_ms", "prefill: pace KV writes for this decode ITL target, ms (0 = off)"},
       NonNegative("itl_target_ms", [](TransportOptions& o) -> double& { return o.pacing.itl_target_ms; })},
      {{"itl_idle_step_ms", "prefill: decode step time with nothing landing, ms"},
       NonNegative("itl_idle_step_ms",
                   [](TransportOptions& o) -> double& { return o.pacing.itl_idle_step_ms; })},
      {{"itl_step_hbm_bytes", "prefill: decode step HBM bytes (when itl_idle_step_ms is not measured)"},
       NonNegative("itl_step_hbm_bytes",
                   [](TransportOptions& o) -> double& { return o.pacing.itl_step_hbm_bytes; })},
      {{"itl_device_bw_bytes_per_s", "prefill: decode GPU copy bandwidth, bytes read+written per s"},
       NonNegative("itl_device_bw_bytes_per_s",
                   [](TransportOptions& o) -> double& { return o.pacing.itl_device_bw_bytes_per_s; })},
      {{"itl_hbm_bytes_per_byte", "prefill: decode HBM bytes per landed byte (2 same GPU, 1 peer/host)"},
       NonNegative("itl_hbm_bytes_per_byte",
                   [](TransportOptions& o) -> double& { return o.pacing.itl_hbm_bytes_per_byte; })},
      {{"gpu_landed_wait", "decode, cuda_ipc: compute stream waits for each layer's copy on the GPU",
        true},
       Flag("gpu_landed_wait", [](TransportOptions& o) -> bool& { return o.cuda_ipc.gpu_landed_wait; })},
      {{"cuda_ipc_copy_mode", "cuda_ipc: auto | memcpy | kernel (copy engine per run, scatter kernel)"},
       Choice<cuda_ipc::CopyMode>("cuda_ipc_copy_mode",
                                  {{"auto", cuda_ipc::CopyMode::kAuto},
                                   {"memcpy", cuda_ipc::CopyMode::kMemcpy},
                                   {"kernel", cuda_ipc::CopyMode::kKernel}},
                                  [](TransportOptions& o) -> cuda_ipc::CopyMode& { return o.cuda_ipc.copy_mode; })},
      {{"cuda_ipc_connect_timeout_ms", "cuda_ipc: bound on connecting to a peer's control socket, ms"},
       Integer<int64_t>("cuda_ipc_connect_timeout_ms", 1, kI64Max,
                        [](TransportOptions& o, int64_t n) { o.cuda_ipc.connect_timeout_ms = n; })},
      {{"nccl_copy_mode", "nccl: auto | direct | pack (one send per run, or gathered into chunks)"},
       Choice<nccl::CopyMode>("nccl_copy_mode",
                              {{"auto", nccl::CopyMode::kAuto},
                               {"direct", nccl::CopyMode::kDirect},
                               {"pack", nccl::CopyMode::kPack}},
                              [](TransportOptions& o) -> nccl::CopyMode& { return o.nccl.copy_mode; })},
      {{"nccl_chunk_mib", "nccl: staging chunk of pack mode, MiB"},
       Integer<uint64_t>("nccl_chunk_mib", 1, 1024,
                         [](TransportOptions& o, uint64_t n) { o.nccl.chunk_bytes = n << 20; })},
      {{"nccl_advertise_host",
        "nccl: host in this transport's address, where writers reach its control socket "
        "(127.0.0.1 = this host only)"},
       [](TransportOptions& o, std::string_view v) {
         if (v.empty()) return Bad("nccl_advertise_host", v, "a host name or address");
         o.nccl.advertise_host = std::string(v);
         return OkStatus();
       }},
      {{"nccl_connect_timeout_ms", "nccl: bound on connect + communicator init + warm-up, ms"},
       Integer<int64_t>("nccl_connect_timeout_ms", 1, kI64Max,
                        [](TransportOptions& o, int64_t n) { o.nccl.connect_timeout_ms = n; })},
      {{"nccl_trace", "nccl: one stderr line per write with the time of each step (true|false)",
        true},
       Flag("nccl_trace", [](TransportOptions& o) -> bool& { return o.nccl.trace; })},
  };
  return keys;
}

}  // namespace

const std::vector<TransportOptionKey>& TransportOptionKeys() {
  static const std::vector<TransportOptionKey> out = [] {
    std::vector<TransportOptionKey> v;
    for (const Key& k : Keys()) v.push_back(k.key);
    return v;
  }();
  return out;
}

Status SetTransportOption(TransportOptions& options, std::string_view key, std::string_view value) {
  std::string name(key);
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  for (const Key& k : Keys()) {
    if (name == k.key.name) return k.set(options, value);
  }
  return NotFound("'" + std::string(key) + "' is not a transport option");
}

}  // namespace kvstream::transport
