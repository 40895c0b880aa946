#include "transport/cuda/landed_flags.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>

#include "common/log.h"

namespace kvstream::transport::cuda {

Result<const StreamMemOps*> StreamMemOps::Get() {
  static const StreamMemOps* ops = []() -> const StreamMemOps* {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == nullptr) return nullptr;
    auto find = [&](const char* v2, const char* v1) {
      void* sym = dlsym(lib, v2);
      if (sym == nullptr) sym = dlsym(lib, v1);
      return reinterpret_cast<Fn>(sym);
    };
    auto* o = new StreamMemOps();
    o->wait_ = find("cuStreamWaitValue32_v2", "cuStreamWaitValue32");
    o->write_ = find("cuStreamWriteValue32_v2", "cuStreamWriteValue32");
    if (o->wait_ == nullptr || o->write_ == nullptr) {
      delete o;
      return nullptr;
    }
    return o;
  }();
  if (ops == nullptr) {
    return Unavailable("cuStreamWaitValue32 / cuStreamWriteValue32 not found in libcuda.so.1");
  }
  return ops;
}

Status StreamMemOps::Wait(cudaStream_t stream, uint64_t addr, uint32_t value) const {
  const int rc = wait_(stream, addr, value, /*CU_STREAM_WAIT_VALUE_GEQ=*/0);
  if (rc != 0) return Internal("cuStreamWaitValue32 failed (CUresult " + std::to_string(rc) + ")");
  return OkStatus();
}

Status StreamMemOps::Write(cudaStream_t stream, uint64_t addr, uint32_t value) const {
  const int rc = write_(stream, addr, value, /*CU_STREAM_WRITE_VALUE_DEFAULT=*/0);
  if (rc != 0) return Internal("cuStreamWriteValue32 failed (CUresult " + std::to_string(rc) + ")");
  return OkStatus();
}

Result<std::unique_ptr<LandedFlagTable>> LandedFlagTable::Create(
    int device, EventPool* events, std::function<void(uint32_t)> drop) {
  KV_ASSIGN_OR_RETURN(const StreamMemOps* ops, StreamMemOps::Get());
  std::unique_ptr<LandedFlagTable> t(new LandedFlagTable());
  t->device_ = device;
  t->events_ = events;
  t->ops_ = ops;
  t->drop_ = std::move(drop);
  KV_ASSIGN_OR_RETURN(t->array_, cuda_vmm::ShareableDeviceMemory::Allocate(device, kSlots * sizeof(uint32_t)));
  KV_ASSIGN_OR_RETURN(t->readback_, PinnedBuffer::Allocate(sizeof(uint32_t)));
  DeviceGuard guard(device);
  KV_RETURN_IF_ERROR(guard.status());
  int least = 0, greatest = 0;
  KV_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest),
                          "cudaDeviceGetStreamPriorityRange");
  // Highest priority: releasing a stuck waiter must not queue behind transfers.
  KV_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithPriority(&t->release_stream_, cudaStreamNonBlocking, greatest),
      "cudaStreamCreateWithPriority (landed flags)");
  KV_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(t->array_->data(), 0, t->array_->size(), t->release_stream_),
                          "cudaMemsetAsync (landed flags)");
  KV_RETURN_IF_ERROR(WaitStreamIdle(t->release_stream_, DeadlineAfterMs(10000)));
  t->slot_conn_.assign(kSlots, 0);
  t->slot_last_.assign(kSlots, 0);
  t->thread_ = std::thread([p = t.get()] { p->Run(); });
  return t;
}

void LandedFlagTable::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

LandedFlagTable::~LandedFlagTable() {
  Stop();
  DeviceGuard guard(device_);
  // Release every stream still waiting before the array goes away, and give them a moment to
  // see it (bounded).
  const Deadline until = DeadlineAfterMs(2000);
  for (auto& [id, c] : conns_) {
    if (c.waits.empty()) continue;
    WriteFlag(c.slot, c.announced);
    for (PendingWait& w : c.waits) {
      if (WaitEvent(w.passed, until).ok()) events_->Release(w.passed);
      // else: left to the pool's destruction (a pending event may be destroyed)
    }
  }
  if (release_stream_ != nullptr) {
    (void)WaitStreamIdle(release_stream_, DeadlineAfterMs(2000));
    (void)cudaStreamDestroy(release_stream_);
  }
}

bool LandedFlagTable::ReadFlag(uint32_t slot, uint32_t* value) {
  std::lock_guard<std::mutex> lock(release_mu_);
  cudaError_t err = cudaMemcpyAsync(readback_->data(), reinterpret_cast<void*>(SlotAddr(slot)),
                                    sizeof(uint32_t), cudaMemcpyDeviceToHost, release_stream_);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    KV_LOG_WARN << "cuda_ipc landed flags: reading slot " << slot << ": " << cudaGetErrorName(err);
    return false;
  }
  Status s = WaitStreamIdle(release_stream_, DeadlineAfterMs(1000));
  if (!s.ok()) {
    KV_LOG_WARN << "cuda_ipc landed flags: reading slot " << slot << ": " << s.ToString();
    return false;
  }
  *value = *static_cast<volatile uint32_t*>(readback_->data());
  return true;
}

void LandedFlagTable::WriteFlag(uint32_t slot, uint32_t value) {
  std::lock_guard<std::mutex> lock(release_mu_);
  Status s = ops_->Write(release_stream_, SlotAddr(slot), value);
  if (!s.ok()) {
    KV_LOG_WARN << "cuda_ipc landed flags: releasing slot " << slot << ": " << s.ToString();
  }
}

Result<FlagGrant> LandedFlagTable::Grant(uint32_t conn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (key_.empty()) return FailedPrecondition("cuda_ipc landed flags: array not registered");
  for (uint32_t i = 0; i < kSlots; ++i) {
    const uint32_t k = (next_slot_ + i) % kSlots;
    if (slot_conn_[k] != 0) continue;
    if (auto old = conns_.find(conn); old != conns_.end()) {
      // The listener's ids wrapped onto a forgotten-too-late record: it is over.
      slot_conn_[old->second.slot] = 0;
      conns_.erase(old);
    }
    Conn c;
    c.slot = k;
    c.first_seq = slot_last_[k] + kSeqGap;
    c.announced = c.first_seq - 1;
    slot_last_[k] = c.announced;
    slot_conn_[k] = conn;
    next_slot_ = (k + 1) % kSlots;
    conns_[conn] = c;
    KV_LOG_INFO << "cuda_ipc: landed flag slot " << k << " granted to writer connection " << conn
                << " (first write " << c.first_seq << ")";
    return FlagGrant{k, c.first_seq, key_};
  }
  return ResourceExhausted("cuda_ipc landed flags: all " + std::to_string(kSlots) +
                           " slots are taken");
}

void LandedFlagTable::OnEarly(uint32_t conn, uint32_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = conns_.find(conn);
  if (it == conns_.end()) return;
  Conn& c = it->second;
  if (SeqReached(seq, c.announced)) c.announced = seq;
  if (SeqReached(seq, slot_last_[c.slot])) slot_last_[c.slot] = seq;
}

void LandedFlagTable::OnClosed(uint32_t conn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = conns_.find(conn);
    if (it == conns_.end() || !it->second.open) return;
    it->second.open = false;
    it->second.closed_at = Clock::now();
  }
  cv_.notify_all();
}

Status LandedFlagTable::Wait(const Notification& n, cudaStream_t stream, Deadline deadline) {
  const uint32_t conn = static_cast<uint32_t>(n.flags) & static_cast<uint32_t>(kLandedConnMask);
  const uint32_t seq = n.landed_seq;
  const std::string what = "request " + std::to_string(n.request_id) + " layer " +
                           std::to_string(n.layer);
  DeviceGuard guard(device_);
  KV_RETURN_IF_ERROR(guard.status());
  KV_ASSIGN_OR_RETURN(cudaEvent_t passed, events_->Acquire());
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = conns_.find(conn);
    if (it == conns_.end() || !it->second.open || it->second.settled) {
      events_->Release(passed);
      return Unavailable("cuda_ipc: the writer of " + what +
                         " is gone (its connection closed); the layer may not have landed");
    }
    Conn& c = it->second;
    if (!SeqReached(c.announced, seq) || SeqReached(c.first_seq - 1, seq)) {
      events_->Release(passed);
      return InvalidArgument("cuda_ipc: " + what + " names write " + std::to_string(seq) +
                             ", which its writer never announced");
    }
    Status s = ops_->Wait(stream, SlotAddr(c.slot), seq);
    if (!s.ok()) {
      events_->Release(passed);
      return s;
    }
    cudaError_t err = cudaEventRecord(passed, stream);
    if (err != cudaSuccess) {
      // The wait is enqueued but cannot be watched: treat its writer as lost, which releases
      // the slot's waiters (the others are watched) once the connection closes.
      events_->Release(passed);
      return CudaStatus(err, "cudaEventRecord after the landed wait");
    }
    c.waits.push_back({seq, deadline, passed});
  }
  cv_.notify_all();
  return OkStatus();
}

Status LandedFlagTable::Confirm(const Notification& n) {
  const uint32_t conn = static_cast<uint32_t>(n.flags) & static_cast<uint32_t>(kLandedConnMask);
  const uint32_t seq = n.landed_seq;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = conns_.find(conn);
  const std::string what = "request " + std::to_string(n.request_id) + " layer " +
                           std::to_string(n.layer);
  if (it == conns_.end()) {
    return Unavailable("cuda_ipc: the writer of " + what +
                       " is no longer known; the layer may not have landed");
  }
  const Conn& c = it->second;
  // Never settled: the connection is open and the table never wrote the flag, so the wait
  // passed on the writer's own flag write.
  if (!c.settled || SeqReached(c.landed, seq)) return OkStatus();
  return Unavailable("cuda_ipc: " + what + " did not land: " + c.why + " (flag at " +
                     std::to_string(c.landed) + ", write " + std::to_string(seq) + ")");
}

uint64_t LandedFlagTable::released_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return released_;
}

void LandedFlagTable::Run() {
  DeviceGuard guard(device_);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const Clock::time_point now = Clock::now();
    bool busy = false;
    std::vector<uint32_t> to_drop;
    for (auto it = conns_.begin(); it != conns_.end();) {
      Conn& c = it->second;
      std::erase_if(c.waits, [&](const PendingWait& w) {
        cudaError_t e = cudaEventQuery(w.passed);
        if (e == cudaErrorNotReady) return false;
        if (e != cudaSuccess) (void)cudaGetLastError();
        events_->Release(w.passed);
        return true;
      });
      std::vector<uint32_t> expired;
      for (const PendingWait& w : c.waits) {
        if (now >= w.deadline) expired.push_back(w.seq);
      }
      if (!c.settled && (!c.open || !expired.empty())) {
        uint32_t v = c.first_seq - 1;
        const bool read = ReadFlag(c.slot, &v);
        // A deadline passed, but the flag shows every such write landed: the waiting stream is
        // only busy with earlier work. Keep watching.
        const bool late_only =
            c.open && read && std::all_of(expired.begin(), expired.end(),
                                          [&](uint32_t s) { return SeqReached(v, s); });
        if (!late_only) {
          c.landed = read ? v : c.first_seq - 1;
          c.settled = true;
          c.why = c.open ? "the copy missed the GPU wait's deadline (the receiver released the "
                           "wait and dropped the writer)"
                         : "the writer's connection closed first (writer died or went away; "
                           "the receiver released any GPU wait)";
          if (!c.waits.empty()) {
            c.released = true;
            ++released_;
            KV_LOG_WARN << "cuda_ipc landed flags: releasing " << c.waits.size()
                        << " GPU wait(s) on slot " << c.slot << " (writer connection " << it->first
                        << (c.open ? " missed a wait's deadline" : " closed") << "; landed up to "
                        << c.landed << ", announced " << c.announced << ")";
          }
          if (c.open) to_drop.push_back(it->first);
        }
      }
      if (!c.waits.empty()) {
        busy = true;
        // Again each round: a dying writer's queued flag write may land after ours.
        if (c.released) WriteFlag(c.slot, c.announced);
      }
      if (!c.open && c.settled && c.waits.empty() &&
          now - c.closed_at > std::chrono::milliseconds(kKeepClosedMs)) {
        slot_conn_[c.slot] = 0;
        it = conns_.erase(it);
        continue;
      }
      ++it;
    }
    if (!to_drop.empty()) {
      lock.unlock();
      for (uint32_t id : to_drop) drop_(id);
      lock.lock();
    }
    cv_.wait_for(lock, busy ? std::chrono::milliseconds(2) : std::chrono::milliseconds(1000));
  }
}

}  // namespace kvstream::transport::cuda
