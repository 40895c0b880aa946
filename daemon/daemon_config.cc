#include "daemon/daemon_config.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <variant>

#include <nlohmann/json.hpp>

#include "transport/options.h"

namespace kvstream::daemon {
namespace {

using json = nlohmann::json;

// One table drives the file keys, the flags, the usage text and ToJson.
using Member = std::variant<std::string DaemonConfig::*, int DaemonConfig::*,
                            int64_t DaemonConfig::*, uint64_t DaemonConfig::*,
                            bool DaemonConfig::*, double DaemonConfig::*>;
struct Field {
  const char* name;
  const char* help;
  Member member;
};

#define KV_FIELD(n, k, h) Field{#n, h, Member(&DaemonConfig::n)}
const std::vector<Field>& Fields() {
  static const std::vector<Field> f = {
      KV_FIELD(model, kStr, "model preset (tiny, llama-3-8b, ...) or HF checkpoint dir"),
      KV_FIELD(layers, kInt, "keep only the first N layers (0 = all)"),
      KV_FIELD(max_position, kInt, "longest sequence accepted (0 = the model's own limit)"),
      KV_FIELD(seed, kU64, "dummy-weight seed"),
      KV_FIELD(weight_dtype, kStr, "f16 | bf16 | f32"),
      KV_FIELD(kv_dtype, kStr, "f16 | bf16 | f32"),
      KV_FIELD(backend, kStr, "cpu | cuda"),
      KV_FIELD(device, kInt, "CUDA device ordinal"),
      KV_FIELD(threads, kInt, "CPU backend threads (0 = all cores)"),
      KV_FIELD(pool_blocks, kInt, "KV pool size in blocks"),
      KV_FIELD(block_size, kInt, "tokens per KV block"),
      KV_FIELD(pool_gpu_fraction, kF64,
               "cuda: pool = this fraction of free device memory after weights (0 = pool_blocks)"),
      KV_FIELD(listen, kStr, "gRPC listen address host:port (port 0 = pick one)"),
      KV_FIELD(port_file, kStr, "write the bound port here once serving"),
      KV_FIELD(peer, kStr, "decode: prefill daemon address(es) host:port[,host:port...]"),
      KV_FIELD(max_concurrent_streams, kInt, "gRPC calls at once on one connection"),
      KV_FIELD(max_connection_idle_ms, kI64,
               "close a gRPC connection this long without calls (0 = never)"),
      KV_FIELD(max_connection_age_ms, kI64,
               "decode: send clients GOAWAY after a connection's this long, so they re-resolve (0 = never)"),
      KV_FIELD(connection_setup_timeout_ms, kI64,
               "a new connection's HTTP/2 (and TLS) setup must finish within this"),
      KV_FIELD(max_open_fds, kInt,
               "accept connections only below this many open descriptors (0 = fd limit - 256)"),
      KV_FIELD(health_listen, kStr,
               "plaintext listener serving only grpc.health.v1, host:port (empty = none)"),
      KV_FIELD(health_port_file, kStr, "write the health listener's port here once serving"),
      KV_FIELD(metrics, kStr,
               "Prometheus metrics at http://host:port/metrics (port 0 = pick one; empty = none)"),
      KV_FIELD(metrics_port_file, kStr, "write the metrics listener's port here once serving"),
      KV_FIELD(metrics_auth_file, kStr,
               "file with user:password that scrapes must present (HTTP basic auth)"),
      KV_FIELD(http, kStr,
               "decode: OpenAI-compatible HTTP endpoint host:port (port 0 = pick one; empty = none)"),
      KV_FIELD(http_port_file, kStr, "write the HTTP endpoint's port here once serving"),
      KV_FIELD(http_model_name, kStr,
               "the model id the HTTP endpoint serves (empty = the preset or checkpoint folder name)"),
      KV_FIELD(drain_delay_ms, kI64,
               "SIGTERM: NOT_SERVING at once, keep admitting this long, then refuse new requests"),
      KV_FIELD(drain_grace_ms, kI64,
               "SIGTERM: then let requests in flight finish this long before cancelling them"),
      KV_FIELD(transport, kStr,
               "data plane: ucx | ucx_staged | cuda_ipc | nccl (GPU pools: ucx = direct or staged)"),
      KV_FIELD(ucx_tls, kStr, "UCX transports, e.g. tcp or sm,tcp (empty = UCX default; shared memory alone cannot detect a failed peer, so peers cannot connect)"),
      KV_FIELD(ucx_net_devices, kStr, "UCX network devices, e.g. lo"),
      KV_FIELD(pace_bytes_per_s, kU64, "prefill: KV write rate limit, bytes/s (0 = unlimited)"),
      KV_FIELD(pace_burst_bytes, kU64, "prefill: burst the rate limit allows (0 = 2 chunks)"),
      KV_FIELD(itl_target_ms, kF64,
               "ITL target, ms (0 = off): prefill paces KV writes for it; decode admits landed "
               "prompts into a step only while the step stays within it"),
      KV_FIELD(itl_idle_step_ms, kF64, "prefill: decode step time with nothing landing, ms"),
      KV_FIELD(itl_step_hbm_bytes, kF64,
               "prefill: decode step HBM bytes (when itl_idle_step_ms is not measured)"),
      KV_FIELD(itl_device_bw_bytes_per_s, kF64,
               "prefill: decode GPU copy bandwidth, bytes read+written per s"),
      KV_FIELD(itl_hbm_bytes_per_byte, kF64,
               "prefill: decode HBM bytes per landed byte (2 same GPU, 1 peer/host)"),
      KV_FIELD(prompt_cache_blocks, kInt,
               "prefill: pool blocks kept for repeated prompts' KV (0 = no prompt cache)"),
      KV_FIELD(kv_tier_secret_file, kStr,
               "file with the cluster secret keying the HMAC of every KV block in the host, "
               "disk and shared tiers (>= 16 printable bytes; chmod 600)"),
      KV_FIELD(kv_host_tier_mb, kInt,
               "prefill: MiB of host memory keeping KV blocks that left the pool (0 = off); a "
               "decode with a GPU pool and kv_store_redis stages its write-down through it"),
      KV_FIELD(kv_disk_tier_dir, kStr,
               "prefill: directory keeping KV blocks as files (empty = off; needs "
               "kv_tier_secret_file)"),
      KV_FIELD(kv_disk_tier_mb, kInt, "prefill: MiB bound of the disk tier's entries"),
      KV_FIELD(kv_tier_max_age_s, kI64,
               "prefill: KV tier entries older than this many seconds are dropped (0 = no bound)"),
      KV_FIELD(kv_disk_tier_erase, kBool,
               "prefill: erase every entry in kv_disk_tier_dir (any model's) at start (true|false)"),
      KV_FIELD(kv_store_redis, kStr,
               "shared KV tier (L4) on Redis: servers unix:/path or host:port, a,b,... (empty = "
               "off; needs kv_tier_secret_file; docs/kv_store.md); the decode writes finished "
               "conversations to it"),
      KV_FIELD(kv_decode_loads_prefix, kStr,
               "decode with kv_store_redis: load a prompt's prefix found in the shared tier "
               "itself, the prefill writing only the rest (auto | true | false; auto: unless "
               "the transport is cuda_ipc or nccl)"),
      KV_FIELD(kv_store_auth_file, kStr,
               "prefill: Redis AUTH file (the password, or ACL user and password on two lines)"),
      KV_FIELD(kv_store_insecure, kBool, "prefill: allow kv_store_redis without an auth file"),
      KV_FIELD(kv_store_ttl_s, kI64, "prefill: shared-tier entries expire after this many s"),
      KV_FIELD(kv_store_timeout_ms, kI64, "prefill: deadline of every shared-tier call"),
      KV_FIELD(kv_store_namespace, kStr,
               "prefill: shared-tier keys live under '<namespace>:' (erase-everything removes them)"),
      KV_FIELD(kv_store_max_pending_mb, kInt,
               "prefill: MiB of blocks waiting for the shared tier's writer (past it: dropped)"),
      KV_FIELD(kv_tier_policy, kStr,
               "best_effort | timeout | wait_complete: how long a request waits for "
               "blocks from the disk and store tiers"),
      KV_FIELD(kv_tier_timeout_ms, kI64, "the timeout policy's bound on that wait"),
      KV_FIELD(kv_prefetch_threshold_tokens, kInt,
               "a tier hit shorter than this many tokens is computed instead of fetched"),
      KV_FIELD(kv_tier_io_threads, kInt, "threads reading the disk and store tiers"),
      KV_FIELD(kv_tier_write_threads, kInt,
               "prefill: threads writing blocks down to the host, disk and store tiers"),
      KV_FIELD(kv_tier_write_policy, kStr,
               "prefill: write_through (blocks go down to the tiers after each prefill) | "
               "write_back (when the prompt cache evicts them, and at shutdown)"),
      KV_FIELD(pipelining, kBool, "decode: stream KV layer by layer by default (true|false)"),
      KV_FIELD(first_step_after_load, kStr,
               "decode: auto | true | false: first step only after every layer landed (auto: "
               "when the prefill computes on this same GPU)"),
      KV_FIELD(gpu_landed_wait, kBool,
               "decode, cuda_ipc + cuda: compute stream waits for each layer's copy on the GPU "
               "(early notifications, landed flags; docs/transports.md) (true|false)"),
      KV_FIELD(on_load_failure, kStr, "decode: fail | recompute when the KV does not land"),
      KV_FIELD(prefill_routing, kStr,
               "decode, several prefills: prefix (by the prompt's first blocks, rendezvous "
               "hashing, load-aware) | least_loaded"),
      KV_FIELD(prefill_route_blocks, kInt,
               "decode: prefix routing keys on the prompt's first this many blocks"),
      KV_FIELD(prefill_route_slack, kInt,
               "decode: prefix routing passes over a prefill with this many more loads in flight "
               "than the least loaded"),
      KV_FIELD(max_batch, kInt, "decode: sequences per decode step"),
      KV_FIELD(queue_timeout_ms, kI64, "decode: wait this long for free KV blocks (0 = fail at once)"),
      KV_FIELD(max_queue, kInt,
               "decode: requests waiting for KV blocks, first come first served (more: refused)"),
      KV_FIELD(request_timeout_ms, kI64, "cap on every request's deadline"),
      KV_FIELD(handshake_timeout_ms, kI64, "per handshake attempt"),
      KV_FIELD(load_timeout_ms, kI64, "decode: bound on a prompt's KV load"),
      KV_FIELD(cancel_timeout_ms, kI64, "bound on confirming a cancelled writer stopped"),
      KV_FIELD(quarantine_ms, kI64, "decode: hold blocks this long after losing their writer"),
      KV_FIELD(log_level, kStr, "debug | info | warn | error"),
      KV_FIELD(log_format, kStr,
               "text | json (json: one object per line: time, level, file, line, msg; gRPC's "
               "own messages too)"),
      KV_FIELD(tls_cert, kStr, "PEM certificate of this daemon (with tls_key, tls_ca: mTLS)"),
      KV_FIELD(tls_key, kStr, "PEM private key of tls_cert"),
      KV_FIELD(tls_ca, kStr, "PEM CA bundle that verifies peers' and clients' certificates"),
      KV_FIELD(tls_peer_names, kStr,
               "prefill with TLS: certificate names (CN or DNS SAN) admitted as peers, a,b,..."),
      KV_FIELD(tls_reload_s, kInt, "re-read the certificate files every N seconds"),
      KV_FIELD(peer_token_file, kStr,
               "file with the peer token (prefill: admits Handshake/Prefill/Cancel; decode: "
               "sent to the prefill)"),
      KV_FIELD(client_token_file, kStr, "file with the client token (admits Generate and Stats)"),
      KV_FIELD(insecure, kBool,
               "allow a non-loopback listen/peer address without credentials (true|false)"),
      KV_FIELD(fault_layer_delay_ms, kI64, "fault injection: prefill sleeps after each layer"),
  };
  return f;
}
#undef KV_FIELD

const Field* FindField(std::string name) {
  for (char& c : name)
    if (c == '-') c = '_';
  for (const Field& f : Fields())
    if (name == f.name) return &f;
  return nullptr;
}

// A key without a field of its own: a transport option (transport/options.h) when
// SetTransportOption takes it (kNotFound: no such key either).
Status SetTransportKey(DaemonConfig* cfg, std::string key, const std::string& value) {
  for (char& c : key)
    if (c == '-') c = '_';
  transport::TransportOptions scratch;
  KV_RETURN_IF_ERROR(transport::SetTransportOption(scratch, key, value));
  cfg->transport_options.emplace_back(key, value);
  return OkStatus();
}

bool IsBooleanTransportKey(std::string key) {
  for (char& c : key)
    if (c == '-') c = '_';
  for (const transport::TransportOptionKey& k : transport::TransportOptionKeys())
    if (key == k.name) return k.boolean;
  return false;
}

bool IsBoolWord(const std::string& v) {
  for (const char* w : {"true", "1", "on", "yes", "false", "0", "off", "no"})
    if (v == w) return true;
  return false;
}

Status SetFromString(DaemonConfig* cfg, const Field& f, const std::string& v) {
  const Member& m = f.member;
  try {
    size_t used = v.size();
    if (auto* s = std::get_if<std::string DaemonConfig::*>(&m)) {
      cfg->*(*s) = v;
    } else if (auto* i = std::get_if<int DaemonConfig::*>(&m)) {
      cfg->*(*i) = std::stoi(v, &used);
    } else if (auto* l = std::get_if<int64_t DaemonConfig::*>(&m)) {
      cfg->*(*l) = std::stoll(v, &used);
    } else if (auto* u = std::get_if<uint64_t DaemonConfig::*>(&m)) {
      if (!v.empty() && v[0] == '-') throw std::invalid_argument(v);
      cfg->*(*u) = std::stoull(v, &used);
    } else if (auto* d = std::get_if<double DaemonConfig::*>(&m)) {
      cfg->*(*d) = std::stod(v, &used);
    } else if (auto* b = std::get_if<bool DaemonConfig::*>(&m)) {
      if (v == "true" || v == "1" || v == "on" || v == "yes") cfg->*(*b) = true;
      else if (v == "false" || v == "0" || v == "off" || v == "no") cfg->*(*b) = false;
      else return InvalidArgument(std::string("--") + f.name + ": expected true|false, got '" + v + "'");
    }
    if (used != v.size()) throw std::invalid_argument(v);
  } catch (const std::exception&) {
    return InvalidArgument(std::string("--") + f.name + ": not a number: '" + v + "'");
  }
  return OkStatus();
}

Status SetFromJson(DaemonConfig* cfg, const Field& f, const json& v) {
  if (v.is_string()) return SetFromString(cfg, f, v.get<std::string>());
  if (v.is_boolean()) return SetFromString(cfg, f, v.get<bool>() ? "true" : "false");
  if (v.is_number()) return SetFromString(cfg, f, v.dump());
  if (v.is_array() && std::string(f.name) == "peer") {
    // "peer": ["host:port", ...] in a config file = the comma-separated flag form.
    std::string joined;
    for (const json& e : v) {
      if (!e.is_string())
        return InvalidArgument("config key 'peer': every element must be a \"host:port\" string");
      joined += (joined.empty() ? "" : ",") + e.get<std::string>();
    }
    if (joined.empty()) return InvalidArgument("config key 'peer': empty list");
    return SetFromString(cfg, f, joined);
  }
  return InvalidArgument(std::string("config key '") + f.name + "': unsupported value " + v.dump());
}

Status Validate(const DaemonConfig& c, const std::string& role) {
  if (c.pool_blocks <= 0) return InvalidArgument("pool_blocks must be > 0");
  if (c.block_size <= 0) return InvalidArgument("block_size must be > 0");
  if (!(c.pool_gpu_fraction >= 0 && c.pool_gpu_fraction < 1))
    return InvalidArgument("pool_gpu_fraction must be in [0, 1)");
  if (c.pool_gpu_fraction > 0 && c.backend != "cuda")
    return InvalidArgument("pool_gpu_fraction needs --backend cuda (it sizes a GPU pool)");
  if (c.layers < 0) return InvalidArgument("layers must be >= 0");
  if (c.max_position < 0) return InvalidArgument("max_position must be >= 0");
  if (c.backend != "cpu" && c.backend != "cuda") return InvalidArgument("backend must be cpu or cuda");
  if (c.log_format != "text" && c.log_format != "json")
    return InvalidArgument("log_format must be text or json");
  if (c.first_step_after_load != "auto" && c.first_step_after_load != "true" &&
      c.first_step_after_load != "false")
    return InvalidArgument("first_step_after_load must be auto, true or false");
  if (c.kv_decode_loads_prefix != "auto" && c.kv_decode_loads_prefix != "true" &&
      c.kv_decode_loads_prefix != "false")
    return InvalidArgument("kv_decode_loads_prefix must be auto, true or false");
  // The interprocess-event version was refused; the landed-flag version passed the GPU tests
  // (landed_event_gpu_test: held copy, killed writer, deadline; daemons_gpu_test with it on;
  // bench/results/landed_wait_2026-11-29.md). Off by default.
  if (c.gpu_landed_wait && (c.transport != "cuda_ipc" || c.backend != "cuda"))
    return InvalidArgument("gpu_landed_wait needs --transport cuda_ipc and --backend cuda");
  if (c.on_load_failure != "fail" && c.on_load_failure != "recompute")
    return InvalidArgument("on_load_failure must be fail or recompute");
  if (c.prefill_routing != "prefix" && c.prefill_routing != "least_loaded")
    return InvalidArgument("prefill_routing must be prefix or least_loaded");
  if (c.prefill_route_blocks < 1) return InvalidArgument("prefill_route_blocks must be >= 1");
  if (c.prefill_route_slack < 1) return InvalidArgument("prefill_route_slack must be >= 1");
  if (c.max_batch <= 0) return InvalidArgument("max_batch must be > 0");
  if (c.max_queue < 0) return InvalidArgument("max_queue must be >= 0");
  if (c.max_concurrent_streams <= 0) return InvalidArgument("max_concurrent_streams must be > 0");
  if (c.max_connection_idle_ms < 0 || c.max_connection_idle_ms > INT32_MAX)
    return InvalidArgument("max_connection_idle_ms must be in [0, 2^31)");
  if (c.max_connection_age_ms < 0 || c.max_connection_age_ms > INT32_MAX)
    return InvalidArgument("max_connection_age_ms must be in [0, 2^31)");
  if (c.connection_setup_timeout_ms <= 0 || c.connection_setup_timeout_ms > INT32_MAX)
    return InvalidArgument("connection_setup_timeout_ms must be in (0, 2^31)");
  if (c.max_open_fds < 0) return InvalidArgument("max_open_fds must be >= 0");
  if (c.drain_delay_ms < 0) return InvalidArgument("drain_delay_ms must be >= 0");
  if (c.drain_grace_ms < 0) return InvalidArgument("drain_grace_ms must be >= 0");
  if (role == "decode" && c.peer.empty()) return InvalidArgument("decode needs --peer (the prefill address)");
  if (role != "decode" && !c.http.empty())
    return InvalidArgument("http: only the decode daemon serves the HTTP endpoint");
  if (role == "decode") {
    for (const std::string& p : SplitPeers(c.peer)) {
      const size_t colon = p.rfind(':');
      if (p.empty() || colon == std::string::npos || colon == 0 || colon + 1 == p.size())
        return InvalidArgument("peer: '" + p + "' is not host:port (in --peer " + c.peer + ")");
    }
  }
  for (int64_t t : {c.request_timeout_ms, c.handshake_timeout_ms, c.load_timeout_ms,
                    c.cancel_timeout_ms})
    if (t <= 0) return InvalidArgument("timeouts must be > 0 ms");
  if (c.quarantine_ms < 0) return InvalidArgument("quarantine_ms must be >= 0");
  if (c.queue_timeout_ms < 0) return InvalidArgument("queue_timeout_ms must be >= 0");
  auto finite_nonneg = [](double v) { return std::isfinite(v) && v >= 0; };
  for (auto [name, v] : {std::pair<const char*, double>{"itl_target_ms", c.itl_target_ms},
                         {"itl_idle_step_ms", c.itl_idle_step_ms},
                         {"itl_step_hbm_bytes", c.itl_step_hbm_bytes},
                         {"itl_device_bw_bytes_per_s", c.itl_device_bw_bytes_per_s}})
    if (!finite_nonneg(v))
      return InvalidArgument(std::string(name) + " must be a finite number >= 0, got " +
                             std::to_string(v));
  if (!(std::isfinite(c.itl_hbm_bytes_per_byte) && c.itl_hbm_bytes_per_byte > 0))
    return InvalidArgument("itl_hbm_bytes_per_byte must be > 0 (2 within one GPU, 1 from a peer "
                           "GPU or the host)");
  // On the prefill itl_target_ms sets the pacing rate (which needs the step's cost); on the
  // decode it bounds the landed prompts joining one step (decode/join_budget.h), which learns
  // the step's cost itself.
  if (role == "prefill" && c.itl_target_ms > 0 && c.pace_bytes_per_s == 0) {
    if (c.itl_device_bw_bytes_per_s <= 0)
      return InvalidArgument("itl_target_ms needs itl_device_bw_bytes_per_s (the decode GPU's "
                             "measured copy bandwidth)");
    if (c.itl_idle_step_ms <= 0 && c.itl_step_hbm_bytes <= 0)
      return InvalidArgument("itl_target_ms needs itl_idle_step_ms (measured) or itl_step_hbm_bytes");
    const double t0_ms = c.itl_idle_step_ms > 0
                             ? c.itl_idle_step_ms
                             : c.itl_step_hbm_bytes / c.itl_device_bw_bytes_per_s * 1e3;
    if (t0_ms >= c.itl_target_ms)
      return InvalidArgument("itl_target_ms " + std::to_string(c.itl_target_ms) +
                             " is not above the idle decode step (" + std::to_string(t0_ms) +
                             " ms): no transfer rate keeps the step within the target");
  }
  if (c.prompt_cache_blocks < 0) return InvalidArgument("prompt_cache_blocks must be >= 0");
  if (c.prompt_cache_blocks >= c.pool_blocks && c.pool_gpu_fraction == 0)
    return InvalidArgument("prompt_cache_blocks must be below pool_blocks (" +
                           std::to_string(c.pool_blocks) + "): requests need blocks of their own");
  if (c.kv_host_tier_mb < 0) return InvalidArgument("kv_host_tier_mb must be >= 0");
  if (c.kv_disk_tier_mb <= 0) return InvalidArgument("kv_disk_tier_mb must be > 0");
  if (c.kv_tier_max_age_s < 0) return InvalidArgument("kv_tier_max_age_s must be >= 0");
  if (!c.kv_disk_tier_dir.empty() && c.kv_tier_secret_file.empty())
    return InvalidArgument("kv_disk_tier_dir needs kv_tier_secret_file (the cluster secret that "
                           "keys every stored block's HMAC)");
  if (c.kv_disk_tier_erase && c.kv_disk_tier_dir.empty())
    return InvalidArgument("kv_disk_tier_erase needs kv_disk_tier_dir");
  if (c.kv_tier_policy != "best_effort" && c.kv_tier_policy != "timeout" &&
      c.kv_tier_policy != "wait_complete")
    return InvalidArgument("kv_tier_policy must be best_effort, timeout or wait_complete");
  if (c.kv_tier_timeout_ms < 0) return InvalidArgument("kv_tier_timeout_ms must be >= 0");
  if (c.kv_prefetch_threshold_tokens < 0)
    return InvalidArgument("kv_prefetch_threshold_tokens must be >= 0");
  if (c.kv_tier_io_threads < 1 || c.kv_tier_io_threads > 64)
    return InvalidArgument("kv_tier_io_threads must be in [1, 64]");
  if (c.kv_tier_write_threads < 1 || c.kv_tier_write_threads > 64)
    return InvalidArgument("kv_tier_write_threads must be in [1, 64]");
  if (c.kv_tier_write_policy != "write_through" && c.kv_tier_write_policy != "write_back")
    return InvalidArgument("kv_tier_write_policy must be write_through or write_back, not '" +
                           c.kv_tier_write_policy + "'");
  // The decode's write-down (finished conversations to the store) has no policy to choose.
  if (role == "prefill" && c.kv_tier_write_policy == "write_back" && c.prompt_cache_blocks == 0 &&
      (c.kv_host_tier_mb > 0 || !c.kv_disk_tier_dir.empty() || !c.kv_store_redis.empty()))
    return InvalidArgument("kv_tier_write_policy write_back needs prompt_cache_blocks > 0: blocks "
                           "are written down when the prompt cache evicts them");
  if (!c.kv_store_redis.empty()) {
    if (c.kv_tier_secret_file.empty())
      return InvalidArgument("kv_store_redis needs kv_tier_secret_file (the cluster secret that "
                             "keys every stored block's HMAC)");
    if (c.kv_store_auth_file.empty() && !c.kv_store_insecure)
      return InvalidArgument("kv_store_redis needs kv_store_auth_file (Redis AUTH), or "
                             "kv_store_insecure=true for a server without a password");
    if (c.kv_store_ttl_s <= 0) return InvalidArgument("kv_store_ttl_s must be > 0");
    if (c.kv_store_timeout_ms <= 0) return InvalidArgument("kv_store_timeout_ms must be > 0");
    if (c.kv_store_max_pending_mb <= 0)
      return InvalidArgument("kv_store_max_pending_mb must be > 0");
  }
  if (c.fault_layer_delay_ms < 0) return InvalidArgument("fault_layer_delay_ms must be >= 0");
  const int tls_files = !c.tls_cert.empty() + !c.tls_key.empty() + !c.tls_ca.empty();
  if (tls_files != 0 && tls_files != 3)
    return InvalidArgument("tls_cert, tls_key and tls_ca go together (mTLS): set all three or none");
  if (tls_files == 3 && role == "prefill" && c.tls_peer_names.empty())
    return InvalidArgument("TLS on the prefill needs tls_peer_names (the certificate names of "
                           "its decode daemons)");
  if (c.tls_reload_s <= 0) return InvalidArgument("tls_reload_s must be > 0");
#ifndef KVSTREAM_FAULT_INJECTION
  if (c.fault_layer_delay_ms != 0)
    return InvalidArgument("fault_layer_delay_ms: this build has no fault injection");
#endif
  return OkStatus();
}

}  // namespace

std::string DaemonConfig::ToJson() const {
  json j;
  for (const Field& f : Fields())
    std::visit([&](auto member) { j[f.name] = this->*member; }, f.member);
  for (const auto& [k, v] : transport_options) j[k] = v;
  // Values come from flags and files as given: bytes that are not UTF-8 print as U+FFFD rather
  // than throw (the daemons log this at start).
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string DaemonUsage(const std::string& role) {
  std::ostringstream os;
  os << "usage: kvstream-" << role << " [--config FILE.json] [--key=value ...]\n"
     << "       kvstream-" << role << " --version   (version, commit, build options, library versions)\n"
     << "Keys (in the JSON file or as flags; flags win):\n";
  DaemonConfig d;
  json defaults = json::parse(d.ToJson());
  for (const Field& f : Fields())
    os << "  --" << f.name << std::string(22 - std::min<size_t>(21, strlen(f.name)), ' ') << f.help
       << " [" << defaults[f.name].dump() << "]\n";
  os << "Transport keys (transport/options.h; in the JSON file or as flags, --key=value):\n";
  for (const transport::TransportOptionKey& k : transport::TransportOptionKeys()) {
    if (FindField(k.name)) continue;  // a key of the table above
    os << "  --" << k.name << std::string(22 - std::min<size_t>(21, strlen(k.name)), ' ') << k.help
       << "\n";
  }
  return os.str();
}

Result<DaemonConfig> ParseDaemonConfig(int argc, char** argv, const std::string& role) {
  DaemonConfig cfg;
  std::vector<std::pair<std::string, std::string>> flags;
  std::string config_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") return NotFound(DaemonUsage(role));
    if (a.rfind("--", 0) != 0) return InvalidArgument("unexpected argument '" + a + "'");
    a = a.substr(2);
    std::string key, value;
    if (auto eq = a.find('='); eq != std::string::npos) {
      key = a.substr(0, eq);
      value = a.substr(eq + 1);
    } else {
      key = a;
      const Field* f = FindField(key);
      const bool is_bool = f ? std::holds_alternative<bool DaemonConfig::*>(f->member)
                             : IsBooleanTransportKey(key);
      // A boolean flag alone ("--insecure") means true; "--pipelining false" still works.
      if (is_bool && (i + 1 >= argc || !IsBoolWord(argv[i + 1]))) {
        value = "true";
      } else {
        if (i + 1 >= argc) return InvalidArgument("--" + key + " needs a value");
        value = argv[++i];
      }
    }
    if (key == "config") config_path = value;
    else flags.emplace_back(key, value);
  }
  if (!config_path.empty()) {
    std::ifstream in(config_path);
    if (!in) return InvalidArgument("cannot open config file " + config_path);
    json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object())
      return InvalidArgument("config file " + config_path + " is not a JSON object");
    for (auto& [k, v] : j.items()) {
      const Field* f = FindField(k);
      if (f) {
        KV_RETURN_IF_ERROR(SetFromJson(&cfg, *f, v).WithContext(config_path));
        continue;
      }
      if (!v.is_string() && !v.is_boolean() && !v.is_number())
        return InvalidArgument("config file " + config_path + ": key '" + k + "': unsupported value " + v.dump());
      const std::string text = v.is_string() ? v.get<std::string>()
                               : v.is_boolean() ? (v.get<bool>() ? "true" : "false")
                                                : v.dump();
      Status s = SetTransportKey(&cfg, k, text);
      if (s.code() == StatusCode::kNotFound)
        return InvalidArgument("config file " + config_path + ": unknown key '" + k + "'");
      KV_RETURN_IF_ERROR(s.WithContext(config_path));
    }
  }
  for (auto& [k, v] : flags) {
    if (const Field* f = FindField(k)) {
      KV_RETURN_IF_ERROR(SetFromString(&cfg, *f, v));
      continue;
    }
    Status s = SetTransportKey(&cfg, k, v);
    if (s.code() == StatusCode::kNotFound) return InvalidArgument("unknown flag --" + k + " (see --help)");
    KV_RETURN_IF_ERROR(s);
  }
  KV_RETURN_IF_ERROR(Validate(cfg, role));
  return cfg;
}

bool ResolveFirstStepAfterLoad(const std::string& setting, const std::string& local_device_id,
                               const std::string& peer_device_id, bool local_shared_via_mps) {
  if (setting == "true") return true;
  if (setting != "auto") return false;
  return !local_device_id.empty() && local_device_id == peer_device_id && !local_shared_via_mps;
}

bool ResolveDecodeLoadsPrefix(const std::string& setting, const std::string& transport) {
  if (setting != "auto") return setting == "true";
  return transport != "cuda_ipc" && transport != "nccl";
}

std::vector<std::string> SplitPeers(const std::string& peers) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = peers.find(',', start);
    out.push_back(peers.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace kvstream::daemon
