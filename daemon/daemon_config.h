// Configuration of the kvstream daemons: a JSON file (--config) overridden by flags.
//
// Every key is accepted both in the file and as a flag: {"pool_blocks": 512} == --pool_blocks=512
// (or --pool_blocks 512; "-" and "_" are interchangeable in flag names). Unknown keys, bad
// values and a missing config file are refused with kInvalidArgument naming the key.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kvstream::daemon {

struct DaemonConfig {
  // model
  std::string model = "tiny";   // preset name or HF checkpoint directory
  int layers = 0;               // >0: keep only the first N layers
  int max_position = 0;         // >0: longest sequence accepted (else the model's own limit)
  uint64_t seed = 0;
  std::string weight_dtype = "f16";
  std::string kv_dtype = "f16";
  // compute
  std::string backend = "cpu";  // cpu | cuda
  int device = 0;
  int threads = 0;
  // KV pool
  int pool_blocks = 256;
  int block_size = 16;
  // cuda backend: >0 sizes the pool as this fraction of the device's free memory after the
  // weights are loaded (overrides pool_blocks); 0 = use pool_blocks.
  double pool_gpu_fraction = 0;
  // network
  std::string listen = "127.0.0.1:0";
  std::string port_file;        // written with the bound port once serving
  std::string peer;             // decode: the prefill daemon address(es), comma-separated
  // Limits of the gRPC server (docs/daemons.md, "Limits"). A host name in `listen` is resolved
  // and one address of it is bound (its first IPv4 address, else its first); a port in use is
  // refused at start.
  int max_concurrent_streams = 128;          // calls at once on one connection
  int64_t max_connection_idle_ms = 300000;   // close a connection this long without calls (0 = never)
  // decode: a client connection gets GOAWAY after this long (calls in flight go on), so clients
  // balancing over DNS re-resolve and reach new decodes (0 = never).
  int64_t max_connection_age_ms = 300000;
  int64_t connection_setup_timeout_ms = 10000;  // a new connection's HTTP/2 (and TLS) setup
  // Connections are accepted only while the daemon has fewer descriptors open than this (the
  // rest are closed at once); 0 = the descriptor limit (raised to its hard limit) less 256.
  int max_open_fds = 0;
  // A plaintext listener serving only grpc.health.v1 (daemon/health.h), for probes that cannot
  // present credentials; empty = none. Its port goes to health_port_file.
  std::string health_listen;
  std::string health_port_file;
  // Prometheus text endpoint (daemon/metrics.h), http://<metrics>/metrics; empty = none. Off
  // loopback it needs metrics_auth_file (a "user:password" line: HTTP basic auth) unless
  // insecure. Its port goes to metrics_port_file.
  std::string metrics;
  std::string metrics_port_file;
  std::string metrics_auth_file;
  // decode: an OpenAI-compatible HTTP endpoint (frontend/http_server.h, docs/http.md) on
  // host:port; empty = none. Its credentials are the gRPC API's (client_token_file, tls_*), with
  // the same loopback / insecure rule. Its port goes to http_port_file; http_model_name is the
  // model id it serves (empty: the preset's name or the checkpoint folder's).
  std::string http;
  std::string http_port_file;
  std::string http_model_name;
  // SIGTERM: readiness NOT_SERVING at once, new requests still admitted for drain_delay_ms, then
  // refused; requests in flight get drain_grace_ms to finish before they are cancelled.
  int64_t drain_delay_ms = 3000;
  int64_t drain_grace_ms = 25000;
  // ucx | ucx_staged | cuda_ipc | nccl. With GPU pools (backend cuda) "ucx" means the UCX path this
  // host's UCX supports: UCX direct on CUDA memory where UCX reports it, else ucx_staged.
  std::string transport = "ucx";
  std::string ucx_tls;          // e.g. "tcp", "sm"; empty = UCX default / $UCX_TLS
  std::string ucx_net_devices;  // e.g. "lo"
  uint64_t pace_bytes_per_s = 0;  // rate limit of KV writes (transport/pacing.h); 0 = unlimited
  uint64_t pace_burst_bytes = 0;  // 0 = default (2 chunks)
  // A pacing rate from a decode inter-token-latency target (transport::PaceRateForItlTarget;
  // docs/pacing.md). Used only when pace_bytes_per_s is 0 (an explicit rate wins). With
  // itl_target_ms > 0: itl_device_bw_bytes_per_s > 0 and one of itl_idle_step_ms (measured) or
  // itl_step_hbm_bytes must be given, and the idle step must be below the target.
  // On the decode, itl_target_ms alone bounds the landed prompts that join one decode step
  // (decode/join_budget.h): they join while the step, predicted from the steps it ran, stays
  // within the target (one every other step at least).
  double itl_target_ms = 0;              // decode ITL target per step, ms (0 = none)
  double itl_idle_step_ms = 0;           // decode step time with nothing landing, ms (t0)
  double itl_step_hbm_bytes = 0;         // or the step's HBM bytes (S), when t0 is not measured
  double itl_device_bw_bytes_per_s = 0;  // the decode GPU's measured copy bandwidth (B)
  double itl_hbm_bytes_per_byte = 2;     // HBM bytes per landed byte (k): 2 same GPU, 1 peer/host
  // behaviour
  bool pipelining = true;       // decode's default load mode
  // decode: start the first token's forward only once every layer of the prompt's KV landed
  // (the transfer still overlaps the prefill's compute). "true", "false", or "auto": true
  // exactly when the handshake showed the prefill computing on this very GPU (same UUID), whose
  // compute a layer-by-layer first step would time-slice with, unless the GPU is shared through
  // MPS (no time slicing there; ResolveFirstStepAfterLoad).
  std::string first_step_after_load = "auto";
  // decode, cuda_ipc + cuda backend: the prefill sends each layer's notification as soon as its
  // copy is enqueued and the decode's compute stream waits for the copy on the GPU (the
  // prefill's copy stream writes a landed flag in the decode's memory after the copy;
  // transport/cuda/landed_flags.h) instead of the host waiting for the completion
  // notification. A layer whose wait the transport had to release (writer died, load deadline)
  // fails the request like a layer that never landed.
  bool gpu_landed_wait = false;
  // The transport keys without a field here (transport/options.h: ucx_copy_lanes, staged_*,
  // cuda_ipc_*, nccl_*, ...), in the order given: checked by transport::SetTransportOption when
  // parsed, applied by CreateTransportFromConfig.
  std::vector<std::pair<std::string, std::string>> transport_options;
  // prefill: keep the KV of up to this many pool blocks of finished prompts, keyed by the whole
  // token sequence; a repeated prompt is written from them without a forward (0 = off).
  int prompt_cache_blocks = 0;
  // The KV tiers below the pool (docs/kv_tiers.md): the cluster secret that keys every stored
  // block's HMAC (kvcache/block_codec.h), read like a token file (>= 16 printable bytes).
  std::string kv_tier_secret_file;
  int kv_host_tier_mb = 0;          // prefill: L2 host-memory tier size (0 = off)
  std::string kv_disk_tier_dir;     // prefill: L3 disk tier directory (empty = off)
  int kv_disk_tier_mb = 1024;       // prefill: L3 size bound
  int64_t kv_tier_max_age_s = 0;    // retention: tier entries older than this are dropped (0 = none)
  bool kv_disk_tier_erase = false;  // erase every entry in kv_disk_tier_dir at start
  // prefill: the shared KV tier (L4, docs/kv_store.md): Redis servers, comma-separated
  // ("unix:/path" or "host:port"), keys sharded over them; empty = off. Needs
  // kv_tier_secret_file. AUTH comes from kv_store_auth_file (the password, or an ACL user and
  // password on two lines), required unless kv_store_insecure. Entries expire after
  // kv_store_ttl_s; every store call is bounded by kv_store_timeout_ms; keys live under
  // "<kv_store_namespace>:"; at most kv_store_max_pending_mb wait for the writer.
  std::string kv_store_redis;
  // decode with kv_store_redis: a prompt's prefix found in the shared tier (or the pinned tier
  // its write-down is staged through) is loaded by the decode itself, the prefill told to write
  // only the rest (PrefillRequest.skip_blocks; decode/kv_tiers.h). The reads follow
  // kv_tier_policy, kv_tier_timeout_ms and kv_prefetch_threshold_tokens, as the prefill's do.
  // "true", "false", or "auto": true unless the data plane is GPU to GPU on one host (cuda_ipc,
  // nccl), which moves KV faster than the decode reads it up from host memory
  // (ResolveDecodeLoadsPrefix).
  std::string kv_decode_loads_prefix = "auto";
  std::string kv_store_auth_file;
  bool kv_store_insecure = false;
  int64_t kv_store_ttl_s = 86400;
  int64_t kv_store_timeout_ms = 250;
  std::string kv_store_namespace = "kvstream";
  int kv_store_max_pending_mb = 256;
  // prefill: how much of a prefix found in the slow tiers (disk, store) a request waits for
  // (docs/kv_tiers.md): best_effort (what host memory holds now; the rest is computed),
  // timeout (up to kv_tier_timeout_ms, then trimmed), wait_complete (all, by the request's
  // deadline). A hit below the pool shorter than kv_prefetch_threshold_tokens is computed
  // instead; kv_tier_io_threads read the slow tiers.
  std::string kv_tier_policy = "wait_complete";
  int64_t kv_tier_timeout_ms = 50;
  int kv_prefetch_threshold_tokens = 256;
  int kv_tier_io_threads = 2;
  // prefill: threads writing blocks down to the tiers below the pool (each encodes and writes
  // one block at a time: the disk tier's HMAC and file write run on that many at once).
  int kv_tier_write_threads = 4;
  // prefill: when a prompt's blocks go down to the tiers (docs/kv_tiers.md): write_through
  // (after every prefill) | write_back (when the prompt cache evicts them from the pool, and
  // at shutdown; needs prompt_cache_blocks > 0 when a tier is on).
  std::string kv_tier_write_policy = "write_through";
  std::string on_load_failure = "fail";  // fail | recompute
  // decode with several prefills (decode/prefill_router.h): prefix (a request goes to the
  // prefill ranked first for its first prefill_route_blocks blocks' key by rendezvous hashing,
  // passed over when not ready or when its loads in flight exceed the least loaded's by
  // prefill_route_slack or more) | least_loaded.
  std::string prefill_routing = "prefix";
  int prefill_route_blocks = 4;
  int prefill_route_slack = 4;
  int max_batch = 32;           // decode: sequences per decode step
  int64_t queue_timeout_ms = 10000;      // decode: wait this long for free KV blocks (0: fail at once)
  int max_queue = 256;          // decode: requests waiting for KV blocks, first come first served
  int64_t request_timeout_ms = 60000;    // cap on any request's deadline
  int64_t handshake_timeout_ms = 5000;
  int64_t load_timeout_ms = 30000;       // decode: whole KV load, from start_load
  int64_t cancel_timeout_ms = 3000;
  int64_t quarantine_ms = 2000;
  std::string log_level;        // debug | info | warn | error
  std::string log_format = "text";  // text | json (one JSON object per line; common/log.h)
  // control-plane authentication (daemon/credentials.h, docs/security.md)
  std::string tls_cert;         // PEM: this daemon's certificate (server and client side)
  std::string tls_key;          // PEM: its private key
  std::string tls_ca;           // PEM: the CA that signs every daemon's and client's certificate
  std::string tls_peer_names;   // prefill: certificate CN / DNS SAN values that are peers (comma list)
  int tls_reload_s = 60;        // re-read the certificate files this often
  std::string peer_token_file;  // prefill: admits peers with it; decode: presents it to prefills
  std::string client_token_file;  // admits clients (Generate, Stats) with it
  bool insecure = false;        // allow a non-loopback address without credentials
  // Fault injection (builds with KVSTREAM_FAULT_INJECTION only; refused otherwise):
  int64_t fault_layer_delay_ms = 0;  // prefill: sleep after each layer's forward (slow prefill)

  std::string ToJson() const;
};

// argv[0] is skipped. --help yields kNotFound with the usage text as message.
Result<DaemonConfig> ParseDaemonConfig(int argc, char** argv, const std::string& role);
std::string DaemonUsage(const std::string& role);

// DaemonConfig::first_step_after_load applied: "true" / "false" as given; "auto" is true when
// both device ids are known (non-empty) and equal, i.e. prefill and decode compute on one GPU,
// and that GPU is not shared through MPS.
// Under MPS (local_shared_via_mps, ComputeDeviceSharedViaMps) the two processes' kernels run
// side by side instead of being time-sliced, so "auto" keeps the layer-by-layer first step there.
bool ResolveFirstStepAfterLoad(const std::string& setting, const std::string& local_device_id,
                               const std::string& peer_device_id, bool local_shared_via_mps = false);

// DaemonConfig::kv_decode_loads_prefix resolved against DaemonConfig::transport.
bool ResolveDecodeLoadsPrefix(const std::string& setting, const std::string& transport);

// DaemonConfig::peer split at commas: the decode daemon's prefill daemons, in order (one
// element when there is no comma; empty elements are kept, and refused by the config check).
std::vector<std::string> SplitPeers(const std::string& peers);

}  // namespace kvstream::daemon
