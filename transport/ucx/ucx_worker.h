// The UCX backend's worker (transport/ucx/): one ucp context and worker per Transport, owned by
// a dedicated progress thread (the worker is created UCS_THREAD_MODE_SERIALIZED and only that
// thread calls into it after Create). Callers hand work to it through a queue; the thread spins on
// ucp_worker_progress while anything is in flight and sleeps on the worker's event fd
// (UCP_FEATURE_WAKEUP) plus an eventfd when idle. Same-host copies run on its copier thread and
// copy lanes. Writers connect to its ucp_listener, admitted by ucx_admission.h.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "transport/task_thread.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_admission.h"
#include "transport/ucx/ucx_same_host.h"
#include "transport/ucx/ucx_wire.h"

namespace kvstream::transport::ucx {

struct UcxRegionState;

// The kvstream status of a UCX status (kRemoteDisconnect for a lost peer, ...).
Status FromUcs(ucs_status_t s, const std::string& what);

class UcxWorker {
 public:
  static Result<std::shared_ptr<UcxWorker>> Create(const UcxOptions& options);
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  ucp_context_h context() const { return context_; }
  ucp_worker_h worker() const { return worker_; }
  // This worker's transport address; with a same-host gate, each call carries a new gate token
  // (good for one writer: ucx_same_host.h).
  std::string address() const;
  // Where writers connect (ucx_admission.h admits them) and this worker's own client id, sent
  // in its connection requests.
  ucp_listener_h listener() const { return listener_; }
  uint64_t client_id() const { return client_id_; }
  // Progress-thread only, except its counters.
  Admission& admission() { return *admission_; }
  const Admission& admission() const { return *admission_; }
  bool cuda_memory() const { return cuda_memory_; }
  const HostIdentity& identity() const { return identity_; }
  bool cma_allowed() const { return cma_allowed_; }
  // The same-host gate writers on this host join (nullptr where same-host copies are off or it
  // could not be made).
  SameHostGate* gate() const { return gate_.get(); }
  TaskThread& copier() { return *copier_; }
  // Same-host copies run on up to max_copy_lanes() threads: the copier is lane 0, lanes 1.. are
  // extra threads made on first use (a daemon that never copies on its host never starts them).
  int max_copy_lanes() const { return max_copy_lanes_; }
  TaskThread& copy_lane(int i);
  bool OnThread() const { return std::this_thread::get_id() == thread_.get_id(); }
  // On the progress thread, the copier or a copy lane: where the last reference to the worker
  // must not be dropped (the worker would join the thread it runs on). The shared_ptr that
  // Create() returns hands such a last reference to a short-lived thread that destroys it.
  bool OnInternalThread();

  // Runs fn on the progress thread, in order of posting.
  void Post(std::function<void()> fn);
  // Runs fn on the progress thread and returns its status (inline when already on it).
  Status RunSync(std::function<Status()> fn);

  void SetSink(NotificationSink sink) {
    auto p = sink ? std::make_shared<const NotificationSink>(std::move(sink)) : nullptr;
    std::lock_guard<std::mutex> lock(sink_mu_);
    sink_ = std::move(p);
  }
  std::shared_ptr<const NotificationSink> sink() const {
    std::lock_guard<std::mutex> lock(sink_mu_);
    return sink_;
  }

  // The registrations data messages may land in (ucx_receiver.cc), by start address. Any thread.
  void AddRegion(uint64_t addr, uint64_t length, std::weak_ptr<UcxRegionState> region);
  void RemoveRegion(uint64_t addr, const UcxRegionState* region);
  // The live registration holding [addr, addr + length) whole, or nullptr.
  std::shared_ptr<UcxRegionState> FindRegion(uint64_t addr, uint64_t length) const;

  // Progress-thread only: data messages being received (ids in order of arrival) and the
  // notifications held until every data message that arrived before them has landed
  // (ucx_receiver.cc).
  struct Landing {
    uint64_t next_id = 0;
    std::set<uint64_t> receiving;
    std::deque<std::pair<uint64_t, Notification>> held;  // (next_id when it came, notification)
  };
  Landing landing;

  // Progress-thread only: writes and closes in flight keep the thread spinning.
  int busy = 0;
  // Progress-thread only: periodic checks (close deadlines) run each loop while non-empty.
  std::unordered_map<void*, std::function<bool()>> watchers;

 private:
  UcxWorker() = default;
  void Loop();

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  std::unique_ptr<Admission> admission_;
  uint64_t client_id_ = 0;
  WireSockAddr listen_{};
  bool cuda_memory_ = false;
  HostIdentity identity_;
  bool cma_allowed_ = false;
  std::unique_ptr<SameHostGate> gate_;
  std::unique_ptr<TaskThread> copier_;
  int max_copy_lanes_ = 1;
  std::mutex lanes_mu_;
  std::vector<std::unique_ptr<TaskThread>> lanes_;  // lanes 1.. (index i - 1)
  int worker_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;

  std::mutex mu_;
  std::deque<std::function<void()>> queue_;
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> stopping_{false};

  struct RegionEntry {
    uint64_t length = 0;
    std::weak_ptr<UcxRegionState> state;
    const UcxRegionState* raw = nullptr;
  };
  mutable std::mutex regions_mu_;
  std::map<uint64_t, RegionEntry> regions_;

  mutable std::mutex sink_mu_;
  std::shared_ptr<const NotificationSink> sink_;
};

}  // namespace kvstream::transport::ucx
