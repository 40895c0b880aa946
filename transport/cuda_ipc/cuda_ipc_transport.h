// CUDA IPC transport: moves CUDA device memory between processes on one host (same GPU, or
// GPUs that can reach each other as peers). Registered only when CUDA is built in.
//
// How it maps onto transport.h:
//  - Register(kCuda region): shareable device memory (common/cuda_vmm.h: cuMemCreate with POSIX
//    descriptor handles; the model's KV pools are) is exported once as a descriptor, kept by
//    the registration under a random 64-bit grant id. The RemoteKey carries that id, the
//    region's offset and length inside its allocation, the device's PCI id and the host's boot
//    id; no handle. Other device memory (cudaMalloc'd) registers for local use (a write's
//    source) with grant id 0; a writer given such a key refuses it at Connect
//    (kFailedPrecondition, naming why): no legacy CUDA IPC handle is made or accepted. kHost
//    regions: kNotSupported.
//  - LocalAddress(): "unix:<dir>/sock?token=<hex>", the control socket this transport listens
//    on (transport/cuda/control_socket.h: a 0600 filesystem socket in a 0700 directory, this
//    uid only (SO_PEERCRED), the token required in the writer's hello); notifications arrive
//    there and are handed to the NotificationSink, their MACs unchanged; registered memory
//    leaves only there, as its descriptor (SCM_RIGHTS), on a connection that passed the hello.
//  - Connect(): connects the control socket, then asks for each region's memory by its grant
//    id: the receiver answers with the allocation's descriptor and the registration's place in
//    it (a grant id it does not hold, e.g. a forged key or one of a registration since
//    destroyed, is refused: kNotFound; a key whose offset or length differ from the
//    registration's: kInvalidArgument). The writer maps each allocation once per endpoint
//    (cuMemImportFromShareableHandle, cuMemMap, cuMemSetAccess for its device), closes the
//    descriptor, and creates the endpoint's copy stream at the LOWEST stream priority, so
//    transfers never preempt compute.
//  - Write(): validates every op, coalesces runs that are contiguous on both sides, optionally
//    makes the copy stream wait on `after_stream`, then copies with cudaMemcpyAsync per run (few
//    runs: the copy engines), or, for many scattered runs, with a scatter-copy kernel whose table
//    travels in its launch parameters: for paged writes (every op a multiple of one power-of-two
//    unit, destinations disjoint) a unit-index list, one launch per 4088 units with CUDA >= 12.1
//    (508 before); otherwise packed runs, one launch per 336 runs (runs that are not 16-byte
//    aligned or lie 64 GiB or more apart use a run table in a pinned host ring instead), in
//    the kernels' default launch shape (kernels/scatter_copy.h). An event from a per-transport pool marks completion.
//    Once it has completed the notification goes out on the control socket (from Wait()'s
//    thread or the endpoint's completion thread, whichever sees it first; exactly once; the
//    completion thread sends the notifications of writes that completed together in one
//    socket write). Write() takes no lock that a CUDA call or a syscall runs under, allocates
//    only the op and its handle, and wakes the completion thread only when it is parked.
//  - Early notifications (the receiver was made with gpu_landed_wait; its address ends in "#lf";
//    landed_flags.h): the receiver grants each writer connection a 32-bit flag in a device
//    array of its own (shareable memory, granted as a descriptor like a region); the writer
//    maps it once, its copy stream writes the write's sequence
//    number into it after each notified write's copy (cuStreamWriteValue32), and it sends the
//    notification at once, flagged kNotificationLandedOnEvent (transport.h) with landed_seq.
//    The receiver's StreamWaitLanded makes a stream wait for the flag (cuStreamWaitValue32);
//    a writer that dies or a deadline that passes releases such waits (ConfirmLanded then
//    says the data did not land). The WriteHandle still completes only when the copy has.
//    Writes with non-zero notification flags, and writers or receivers without the driver's
//    stream memory operations, notify after completion as usual.
//  - Peer death: EOF on the control socket -> endpoint status, pending and later writes
//    kRemoteDisconnect (detected within about 20 ms).
//  - ~Endpoint: stops the completion thread, waits (bounded, close_timeout_ms) for its copy
//    stream to drain, fails unfinished handles with kCanceled and unmaps the peer's memory, so
//    nothing more can land. Handles may outlive their endpoint (they then report the result).
//  - Destroying a Registration closes its descriptor and refuses later requests for it; a
//    mapping a writer already made stays valid while that writer's endpoint lives (the driver
//    has no revocation); the physical memory lives until the last mapping goes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/status.h"
#include "transport/options.h"
#include "transport/transport.h"

namespace kvstream::transport::cuda_ipc {

// CudaIpcOptions, CopyMode: transport/options.h.

// kUnavailable when no CUDA device is usable (message says why).
Result<std::unique_ptr<Transport>> CreateCudaIpcTransport(const CudaIpcOptions& options);
// For the registry: options.cuda_ipc on options.device.
Result<std::unique_ptr<Transport>> CreateCudaIpcTransport(const TransportOptions& options);

// Host-side cost of Write(), for benchmarks: summed over every cuda_ipc endpoint of the process
// while enabled (off by default; when on, four clock reads per Write()).
struct WriteProfile {
  uint64_t writes = 0;
  uint64_t plan_ns = 0;     // validation, coalescing, copy-path choice
  uint64_t submit_ns = 0;   // CUDA calls: event record/wait, memcpy or kernel launch + table
  uint64_t copy_ns = 0;     //   of which the copy calls (cudaMemcpyAsync / kernel launches)
  uint64_t record_ns = 0;   //   of which the completion event record
  uint64_t enqueue_ns = 0;  // op allocation, hand-off to the completion thread, the handle
  uint64_t total_ns = 0;    // the whole Write() after argument checks
  uint64_t kernel_writes = 0, memcpy_writes = 0, memcpy_calls = 0;
  uint64_t block_writes = 0;  // of kernel_writes: through the block-table kernel
  uint64_t notify_batches = 0, notify_frames = 0;  // the completion thread's socket writes
  uint64_t wakeups = 0;                            // eventfd wakes of a parked completion thread
};
void EnableWriteProfile(bool on);
WriteProfile TakeWriteProfile();  // returns the counters and resets them

}  // namespace kvstream::transport::cuda_ipc
