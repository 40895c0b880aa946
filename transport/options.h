// Transport options: one struct per backend inside TransportOptions, set in one place.
// SetTransportOption() parses one "key=value" (TransportOptionKeys() lists the keys with their
// help text); the daemons' flags and config file reach it for every transport key they have no
// field of their own for (daemon/daemon_config.h). No backend reads the environment, except UCX
// itself, which still reads its own UCX_* variables (UCX_TLS, UCX_NET_DEVICES) where the options
// leave them empty.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvstream::transport {

struct UcxOptions {
  std::string tls;          // UCX transports, e.g. "tcp", "sm"; empty = UCX's default / $UCX_TLS
  std::string net_devices;  // UCX network devices, e.g. "lo"; empty = UCX's default
  // Peers on this host, where `tls` admits shared memory: kvstream copies into the peer's
  // memory itself (its memfd mapped here, or process_vm_writev). false = UCX puts always.
  bool same_host_copy = true;
  // Threads that copy one same-host write (one per 4 MiB of it, up to this many, at most 32).
  // 0 = half this host's cores, 1..8.
  int copy_lanes = 0;
  // Connections into this transport arrive at a ucp_listener. false (the default): a writer's
  // connection is accepted only once Transport::Admit() admitted its endpoint's ticket. true:
  // every connection request is accepted (benchmarks only, whose two ends admit nothing;
  // not settable by a flag).
  bool admit_any = false;
};

// Rate limit of the writes through one transport (transport/pacing.h). All 0 = unpaced.
struct PacingOptions {
  double bytes_per_s = 0;    // > 0: the rate; 0 = from the ITL target below, or unlimited
  uint64_t burst_bytes = 0;  // 0 = 2 chunks
  uint64_t chunk_bytes = 0;  // 0 = what the rate moves in 1 ms, clamped to [256 KiB, 64 MiB]
  // A rate from a decode inter-token-latency target (PaceRateForItlTarget, docs/pacing.md),
  // used when bytes_per_s is 0: the decode step's idle time (t0), or its HBM bytes per step (S)
  // when t0 is not measured, the device's measured copy bandwidth (B) and the HBM bytes per
  // landed byte (k).
  double itl_target_ms = 0;
  double itl_idle_step_ms = 0;
  double itl_step_hbm_bytes = 0;
  double itl_device_bw_bytes_per_s = 0;
  double itl_hbm_bytes_per_byte = 2;
};

namespace staged {

enum class ZeroCopy {
  kAuto,  // same-host peers: device -> host copies straight into the peer's slots when possible
  kOff,   // always UCX puts (the path between hosts, also on one host)
};

// The host-staged transport (transport/staged/staged_transport.h).
struct StagedOptions {
  int device = -1;                     // device of registered regions and streams; -1 = current
  size_t chunk_bytes = 8ull << 20;     // data bytes per chunk (one staging slot)
  // Pipeline depth: a send buffer is busy from its D2H copy until the UCX put is done, a peer
  // slot (credit) from the D2H copy until the peer's H2D copy is done and the credit is back.
  // Six of each keep D2H of chunk k+1, the put of chunk k and the peer's H2D of chunk k-1 all
  // in flight with room for the credit round trip.
  int recv_slots = 12;                 // receive staging slots (shared by all writers)
  int send_buffers = 6;                // per-endpoint pinned send buffers (pipeline depth)
  int credits_per_peer = 6;            // slots granted to one writer
  UcxOptions ucx;                      // the inner UCX transport's
  int64_t connect_timeout_ms = 10000;  // hello -> first credits
  int64_t close_timeout_ms = 10000;    // ~Endpoint's bound on draining
  ZeroCopy zero_copy = ZeroCopy::kAuto;
  // A write smaller than min_chunks_per_write * chunk_bytes is cut into that many chunks (of at
  // least 1 MiB) so that the receiver's host -> device copy of its first part overlaps the
  // device -> host copy of the rest (one layer's latency); 1 = chunks of chunk_bytes always.
  int min_chunks_per_write = 1;
  // Chunk size per write (chunk_plan.h): sqrt((bytes queued ahead + its bytes) *
  // adaptive_chunk_fill), rounded up to 64 KiB, at least 1 MiB, at most chunk_bytes, so that a
  // lone layer does not wait for a large first chunk. 0 = always chunk_bytes.
  uint64_t adaptive_chunk_fill = 256 << 10;
  // How often the pipeline threads look at copy events (and doorbells) while chunks are in
  // flight (they also wake on every message). 0 = busy wait (a core each while chunks are in
  // flight, and the receiver's for 2 ms after its last chunk): no sleep and wake-up per look.
  int64_t poll_us = 0;
  // Receiver: a lost writer's slots are reused once the writer process is known to have exited,
  // or after this long (a copy or put of it could still be landing).
  int64_t reclaim_quarantine_ms = 2000;
  // Receiver: a writer that holds slots and has heard nothing for this long gets a ping, so a
  // dead one shows up as a failed send.
  int64_t writer_ping_ms = 250;
};

}  // namespace staged

namespace cuda_ipc {

enum class CopyMode {
  kAuto,    // cudaMemcpyAsync per run for few runs, the scatter kernel for many
  kMemcpy,  // always cudaMemcpyAsync per run
  kKernel,  // always the scatter kernel
};

// The CUDA IPC transport (transport/cuda_ipc/cuda_ipc_transport.h).
struct CudaIpcOptions {
  int device = -1;                   // device of local registrations and copy streams; -1 = current
  CopyMode copy_mode = CopyMode::kAuto;
  size_t kernel_min_runs = 4;        // kAuto: the kernel from this many coalesced runs on
  // Writes whose ops are all multiples of one power-of-two unit (a paged pool's blocks) go to
  // the block-table kernel: a unit-index list in the launch parameters, one launch for up to
  // 4088 units with CUDA >= 12.1 (kernels/scatter_copy.h). false: the packed-run path (<= 336
  // runs per launch), which writes the block form does not fit take anyway, for every kernel
  // write (tests cover that path through it).
  bool block_table = true;
  size_t table_entries = 64 * 1024;  // per-endpoint pinned run-table ring (24 B each)
  // Receiver: ask writers for early notifications (transport.h kNotificationLandedOnEvent): a
  // notified write's notification leaves as soon as its copy is enqueued, naming the sequence
  // number the writer's copy stream writes into this receiver's landed flag after the copy;
  // the consumer makes its GPU stream wait for it with StreamWaitLanded instead of waiting on
  // the host for completion, and checks ConfirmLanded once that work is done. The address then
  // ends in "#lf". Without the driver's stream memory operations the receiver stays late (logged).
  bool gpu_landed_wait = false;
  int64_t connect_timeout_ms = 5000;
  int64_t close_timeout_ms = 10000;  // ~Endpoint's bound on draining its copy stream
};

}  // namespace cuda_ipc

namespace nccl {

enum class CopyMode {
  kAuto,    // ChooseMode: direct for few / long runs, pack for many scattered ones
  kDirect,  // always one ncclSend/ncclRecv per coalesced run
  kPack,    // always gather -> one send per chunk -> scatter
};

// The NCCL transport (transport/nccl/nccl_transport.h).
struct NcclOptions {
  int device = -1;                        // device of registrations and streams; -1 = current
  CopyMode copy_mode = CopyMode::kAuto;
  uint64_t chunk_bytes = 64ull << 20;     // staging chunk (two per endpoint and per connection)
  std::string advertise_host = "127.0.0.1";  // host put into LocalAddress(); 127.0.0.1 binds lo
  int64_t connect_timeout_ms = 60000;     // TCP connect + hello + communicator init + warm-up
  int64_t close_timeout_ms = 5000;        // ~Endpoint: how long posted writes may still finish
  // One stderr line per completed write on each side, with the time of each step (header sent,
  // NCCL launch returned / done, landed, acked), to see where a write's time goes.
  bool trace = false;
};

}  // namespace nccl

struct TransportOptions {
  std::string backend = "ucx";  // see AvailableBackends()
  int device = -1;              // CUDA device of registered memory, for GPU backends
  UcxOptions ucx;               // ucx, and the inner transport of ucx_staged
  staged::StagedOptions staged; // ucx_staged (its device and ucx come from the two above)
  cuda_ipc::CudaIpcOptions cuda_ipc;  // cuda_ipc (its device comes from `device`)
  nccl::NcclOptions nccl;             // nccl (its device comes from `device`)
  // CreateTransport wraps the backend so that every endpoint it connects draws on one budget.
  PacingOptions pacing;
};

struct TransportOptionKey {
  const char* name;
  const char* help;
  bool boolean = false;  // true|false: a flag alone on a command line means true
};
// The keys SetTransportOption accepts, in the order a usage text lists them.
const std::vector<TransportOptionKey>& TransportOptionKeys();

// Sets the option `key` ('-' and '_' alike) from its text `value`. kNotFound for a key that is
// not a transport option; kInvalidArgument (naming the key) for a malformed or out-of-range
// value, which leaves `options` unchanged.
Status SetTransportOption(TransportOptions& options, std::string_view key, std::string_view value);

}  // namespace kvstream::transport
