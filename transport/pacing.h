// Pacing of KV transfers: a rate limit on the bytes a writer pushes into a peer, so that a burst
// of landing prefills cannot take the destination GPU's memory bandwidth away from decoding.
//
// Three layers, each usable alone:
//  - TokenBucket: the budget (bytes/s refill, burst bytes capacity). Thread-safe; one bucket
//    may be shared by any number of writers (endpoints, threads, a benchmark's copy loop), who
//    then share its rate. Reservations are granted in call order (the bucket goes into debt,
//    and later callers wait for it to be repaid), so no writer starves another.
//  - PaceEndpoint(): a decorator over any transport's Endpoint. Write() splits the request's
//    bytes into chunks of at most `chunk_bytes` and posts each chunk to the inner endpoint only
//    once the bucket releases its bytes; the write's notification rides on the last chunk, which
//    is posted only after every earlier chunk of that write has completed, so the notification
//    still arrives only after all of the write's bytes landed.
//  - PaceTransport(): a decorator over a Transport whose endpoints all draw on one bucket.
//    CreateTransport() applies it when TransportOptions ask for pacing (see ResolvePacing()).
//
// Guarantees of a paced endpoint (on top of transport.h's, which all still hold):
//  - Write() never blocks on the budget: it validates the request (shape, every op against the
//    local registration and the peer region given at construction; kInvalidArgument, nothing
//    posted) and queues it; a worker thread of the endpoint posts the chunks. A refusal that
//    only the inner backend can make (e.g. a registration from another transport) arrives on
//    the handle, with nothing posted.
//  - Over any window longer than burst/rate, the bytes posted stay within
//    burst + rate * window (per bucket, summed over every writer sharing it).
//  - WriteHandle::Wait(deadline) never blocks past the deadline. Cancel() stops posting further
//    chunks at once (their reserved budget is given back), cancels the chunks in flight, and
//    the handle completes (kCanceled, or OK if everything had finished) once none of its bytes
//    are in flight; the notification is not sent unless it had already gone.
//  - A chunk that fails (e.g. kRemoteDisconnect) stops the write: later chunks are not posted,
//    the handle completes with that error once nothing is in flight.
//  - Destroying the paced endpoint stops its worker, cancels what is in flight, destroys the
//    inner endpoint (whose bounded close applies) and then completes every unfinished handle
//    (OK if all its chunks completed, else kCanceled).
//  - WriteRequest::after_stream (GPU producers): chunk 0 carries it; later chunks are posted only
//    after chunk 0 completed (which implies the producer's work was done), without it.
//  - transfers() counts the pieces posted (runs after coalescing, cut at chunk boundaries).
//
// Stream priority: pacing limits the RATE; the GPU backends (transport/cuda_ipc, the staged
// backend) additionally issue their copies on a stream at the device's LOWEST priority
// (cuda::Stream::CreateLowestPriority), and decode runs its kernels on its own stream. Stream
// priority orders the scheduling of kernel thread blocks (e.g. the scatter-copy kernel yields
// SMs to decode); it does not throttle copy engines, which is why the rate limit exists.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "common/status.h"
#include "common/time.h"
#include "transport/transport.h"

namespace kvstream::transport {

// A token bucket over bytes. rate 0 = unlimited (every reservation is released at once).
class TokenBucket {
 public:
  // Starts full (a writer may post `burst_bytes` at once). burst_bytes 0 is taken as 1 byte:
  // every chunk then waits for its own bytes (strict rate, no burst).
  TokenBucket(double bytes_per_s, uint64_t burst_bytes);

  // Takes `bytes` from the bucket now (possibly into debt) and returns when they may be released
  // (<= now when the bucket held them). Calls are served in order: each one's release time is
  // after the previous reservations' bytes are paid for.
  Clock::time_point Reserve(uint64_t bytes);
  // Returns the bytes of a reservation that will not be used (a cancelled chunk). The bucket
  // never rises above its burst.
  void Refund(uint64_t bytes);
  // Reserve + sleep until the release time. false (and the reservation refunded) if the release
  // time is past `deadline`; the call then returns at once, without sleeping.
  bool Acquire(uint64_t bytes, Deadline deadline);

  // Changes the budget from now on (tokens are capped at the new burst).
  void Set(double bytes_per_s, uint64_t burst_bytes);
  double rate() const;
  uint64_t burst() const;
  bool unlimited() const { return rate() <= 0; }
  // Bytes reserved and not refunded, since construction.
  uint64_t reserved_bytes() const;

 private:
  void RefillLocked(Clock::time_point now);
  mutable std::mutex mu_;
  double rate_;
  double burst_;
  double tokens_;
  Clock::time_point last_;
  uint64_t reserved_ = 0;
};

// The options with their defaults filled in; kInvalidArgument for a negative or non-finite rate.
Result<PacingOptions> ResolvePacingDefaults(const PacingOptions& options);

// Wraps `inner` (connected to `peer`, whose region lengths are used for validation). The bucket
// is shared with whoever else holds it; chunk_bytes as in PacingOptions (0 = default for the
// bucket's rate). An unlimited bucket gives back `inner` itself (no decorator, no thread).
Result<std::unique_ptr<Endpoint>> PaceEndpoint(std::unique_ptr<Endpoint> inner,
                                               const PeerDescriptor& peer,
                                               std::shared_ptr<TokenBucket> bucket,
                                               uint64_t chunk_bytes = 0);

// Wraps `inner`: every endpoint it connects is paced by one bucket built from `options`
// (name(), capabilities(), registrations and notifications are the inner transport's). Unlimited
// options give back `inner` itself.
Result<std::unique_ptr<Transport>> PaceTransport(std::unique_ptr<Transport> inner,
                                                 const PacingOptions& options);

// ---- a default rate from an inter-token-latency target ------------------------------------------
//
// Model (docs/pacing.md): a decode step is bound by HBM bandwidth. Idle, it takes t0 and moves
// S bytes, i.e. it draws S/t0 of the bandwidth B the device sustains for copies (bytes read +
// written per second, measured). A transfer landing at r bytes/s draws k*r of that bandwidth
// (k = HBM bytes per transferred byte on the destination GPU: 2 for a copy within one GPU, which
// reads and writes it; 1 for bytes arriving from a peer GPU or the host, which are only written).
// The step keeps its efficiency and runs with what is left, t(r) = t0 * B / (B - k*r). Keeping
// t(r) <= T (the target) gives
//
//     r_max = B * (1 - t0 / T) / k
//
// Assumptions: the step is bandwidth-bound (a latency-bound step is slowed less: the rate is
// conservative); copy engines and kernels share bandwidth in proportion to demand; nothing else
// loads the GPU; T is per step (one token of every sequence in the batch). Measured on an H200
// (bench/decode_under_load): effective k 1.2-2.8 for copies within the GPU, 3.8-6.1 for bytes
// from pinned host memory (PCIe writes cost more than their bytes): pass ~6 for host staging.
struct ItlBudget {
  double itl_target_s = 0;           // T, > 0
  double idle_step_s = 0;            // t0, measured; 0 = derive from step_hbm_bytes / device_bw
  double step_hbm_bytes = 0;         // S (weights + KV + activations per step); used when t0 = 0
  double device_bw_bytes_per_s = 0;  // B, > 0: measured device-to-device copy, read + written
  double hbm_bytes_per_byte = 2;     // k, > 0
};
// r_max in bytes/s (> 0). kFailedPrecondition when t0 >= T (no transfer fits the target; the
// caller decides whether to refuse the target or run unpaced); kInvalidArgument for bad input.
Result<double> PaceRateForItlTarget(const ItlBudget& budget);

// The pacing TransportOptions ask for: pace_bytes_per_s if > 0; else, with itl_target_ms > 0,
// PaceRateForItlTarget over the itl_* fields; else unlimited. Burst and chunk from
// pace_burst_bytes / pace_chunk_bytes (0 = defaults).
Result<PacingOptions> ResolvePacing(const TransportOptions& options);

}  // namespace kvstream::transport
