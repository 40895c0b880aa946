// Landed flags: how cuda_ipc's early notifications (gpu_landed_wait) let a receiver's GPU
// stream wait for a writer's copy without a host round trip, using CUDA stream memory
// operations on 32-bit counters in the receiver's device memory.
//
//  - The receiver allocates an array of kSlots 32-bit flags (LandedFlagTable) and grants each
//    writer connection that asks one slot and a first sequence number (control_socket.h).
//  - The writer maps the array once (its descriptor, granted over the control socket: the array
//    is shareable memory, common/cuda_vmm.h) and, after each early-notified write's copy, its
//    copy stream writes the write's sequence number into its slot (cuStreamWriteValue32,
//    default flags: the copy's writes are visible before the flag) and notifies at once with
//    that number. Its copy stream is in order, so a slot's value only grows.
//  - The receiver's stream waits with cuStreamWaitValue32(GEQ), which compares
//    (int32_t)(*flag - seq) >= 0: sequence numbers may wrap.
//  - A memory wait sees only what was written: unlike a wait on an interprocess event (which
//    sees the last record that executed, so a record still queued behind a dependency in the
//    writer's process may not hold it), it cannot pass before the writer's flag write ran.
//  - Nothing can leave a stream waiting forever: when the writer's connection closes (it died
//    or went away) or a wait's deadline passes before its flag was written, the table reads
//    the flag (what truly landed), then writes the highest announced number into it from its own
//    stream (again every ~10 ms while waits are pending, in case a dying writer's queued flag
//    write lands after it) and, for a deadline, drops the writer's connection. Confirm() then
//    reports the writes above what had landed as lost.
//
// Thread safety: every member may be called from any thread.
#pragma once

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/cuda_vmm.h"
#include "common/status.h"
#include "common/time.h"
#include "transport/cuda/control_socket.h"
#include "transport/cuda/cuda_util.h"
#include "transport/transport.h"

namespace kvstream::transport::cuda {

// cuStreamWaitValue32 (GEQ) / cuStreamWriteValue32 (default flags) from the driver, looked up
// at run time (binaries must start where libcuda.so.1 is absent). kUnavailable without them.
class StreamMemOps {
 public:
  static Result<const StreamMemOps*> Get();
  Status Wait(cudaStream_t stream, uint64_t addr, uint32_t value) const;
  Status Write(cudaStream_t stream, uint64_t addr, uint32_t value) const;

 private:
  using Fn = int (*)(cudaStream_t, unsigned long long, unsigned int, unsigned int);
  Fn wait_ = nullptr;
  Fn write_ = nullptr;
};

// The comparison CU_STREAM_WAIT_VALUE_GEQ makes: value has reached seq (modulo 2^32).
inline bool SeqReached(uint32_t value, uint32_t seq) {
  return static_cast<int32_t>(value - seq) >= 0;
}

class LandedFlagTable {
 public:
  static constexpr uint32_t kSlots = 4096;
  // A new connection's sequence numbers start this far above its slot's last announced one, so
  // that a flag write its predecessor enqueued but never announced cannot satisfy its waits.
  static constexpr uint32_t kSeqGap = 1024;
  // How long a closed connection's record stays for Confirm() (and its slot stays taken).
  static constexpr int64_t kKeepClosedMs = 60000;

  // Allocates the zeroed array on `device`, a release stream and the watchdog thread.
  // `drop(conn)` must close that writer connection (NotificationListener::Drop).
  static Result<std::unique_ptr<LandedFlagTable>> Create(int device, EventPool* events,
                                                         std::function<void(uint32_t)> drop);
  ~LandedFlagTable();
  // Stops the watchdog (no more drop calls); the destructor does it too. Waits are no longer
  // watched afterwards: call only on the way to destruction.
  void Stop();
  LandedFlagTable(const LandedFlagTable&) = delete;
  LandedFlagTable& operator=(const LandedFlagTable&) = delete;

  void* array() const { return array_->data(); }
  size_t array_bytes() const { return array_->size(); }
  // The key writers map the array with (set once, before the first Grant).
  void SetArrayKey(std::string key) { key_ = std::move(key); }

  // Listener thread. kResourceExhausted when every slot is taken.
  Result<FlagGrant> Grant(uint32_t conn);
  // Listener thread, before the notification reaches the consumer: seq was announced.
  void OnEarly(uint32_t conn, uint32_t seq);
  void OnClosed(uint32_t conn);

  // See Transport::StreamWaitLanded / ConfirmLanded. `n` carries the connection in its flags
  // (kLandedConnMask) and the sequence number in landed_seq.
  Status Wait(const Notification& n, cudaStream_t stream, Deadline deadline);
  Status Confirm(const Notification& n);

  // For tests: the number of connections whose waits the table released itself.
  uint64_t released_count() const;

 private:
  struct PendingWait {
    uint32_t seq;
    Deadline deadline;
    cudaEvent_t passed;  // recorded on the waiting stream right after the wait
  };
  struct Conn {
    uint32_t slot = 0;
    uint32_t first_seq = 1;
    uint32_t announced = 0;  // highest announced sequence number (first_seq - 1: none)
    bool open = true;        // its control socket
    bool settled = false;    // closed or released, `landed` read
    bool released = false;   // the table wrote the flag itself
    uint32_t landed = 0;     // when settled: the flag's value read then
    std::string why;         // when settled: why, for Confirm's status
    std::vector<PendingWait> waits;
    Clock::time_point closed_at{};
  };

  LandedFlagTable() = default;
  void Run();
  // Reads the slot's flag (bounded); false on failure.
  bool ReadFlag(uint32_t slot, uint32_t* value);
  void WriteFlag(uint32_t slot, uint32_t value);
  uint64_t SlotAddr(uint32_t slot) const {
    return reinterpret_cast<uint64_t>(array_->data()) + uint64_t(slot) * sizeof(uint32_t);
  }

  int device_ = -1;
  EventPool* events_ = nullptr;
  const StreamMemOps* ops_ = nullptr;
  std::function<void(uint32_t)> drop_;
  // Shareable (common/cuda_vmm.h): a writer maps it from the descriptor the listener grants.
  std::unique_ptr<cuda_vmm::ShareableDeviceMemory> array_;
  std::unique_ptr<PinnedBuffer> readback_;
  cudaStream_t release_stream_ = nullptr;
  std::string key_;

  mutable std::mutex mu_;  // everything below
  std::condition_variable cv_;
  bool stop_ = false;
  std::map<uint32_t, Conn> conns_;
  std::vector<uint32_t> slot_conn_;  // 0: free
  std::vector<uint32_t> slot_last_;  // last sequence number announced on the slot
  uint32_t next_slot_ = 0;
  uint64_t released_ = 0;
  std::mutex release_mu_;  // the release stream and readback buffer (watchdog, destructor)
  std::thread thread_;
};

}  // namespace kvstream::transport::cuda
