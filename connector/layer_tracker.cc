#include "connector/layer_tracker.h"

#include <string>

namespace kvstream::connector {

Status LayerTracker::Begin(uint64_t request_id, int num_layers) {
  if (num_layers <= 0) return InvalidArgument("LayerTracker::Begin: num_layers must be > 0");
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = entries_.try_emplace(request_id);
  if (!inserted) return AlreadyExists("request " + std::to_string(request_id) + " is already tracked");
  it->second.landed.assign(num_layers, false);
  return OkStatus();
}

void LayerTracker::OnLanded(uint64_t request_id, int layer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(request_id);
    if (it == entries_.end() || !it->second.failure.ok() || layer < 0 ||
        layer >= static_cast<int>(it->second.landed.size())) {
      ++ignored_;
      return;
    }
    it->second.landed[layer] = true;
  }
  cv_.notify_all();
}

void LayerTracker::OnAllLanded(uint64_t request_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(request_id);
    if (it == entries_.end() || !it->second.failure.ok()) {
      ++ignored_;
      return;
    }
    it->second.landed.assign(it->second.landed.size(), true);
  }
  cv_.notify_all();
}

void LayerTracker::Fail(uint64_t request_id, const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(request_id);
    if (it == entries_.end() || !it->second.failure.ok()) return;
    it->second.failure =
        status.ok() ? Internal("request " + std::to_string(request_id) + " failed") : status;
  }
  cv_.notify_all();
}

Status LayerTracker::WaitForLayer(uint64_t request_id, int layer, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    auto it = entries_.find(request_id);
    if (it == entries_.end())
      return NotFound("request " + std::to_string(request_id) + " is not being loaded");
    Entry& e = it->second;
    if (!e.failure.ok()) return e.failure;
    if (layer < 0 || layer >= static_cast<int>(e.landed.size()))
      return InvalidArgument("layer " + std::to_string(layer) + " out of range for request " +
                             std::to_string(request_id));
    if (e.landed[layer]) return OkStatus();
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && Clock::now() >= deadline) {
      it = entries_.find(request_id);
      if (it != entries_.end() && it->second.failure.ok() && it->second.landed[layer])
        return OkStatus();
      return Timeout("waiting for layer " + std::to_string(layer) + " of request " +
                     std::to_string(request_id) + " to land");
    }
  }
}

void LayerTracker::Finish(uint64_t request_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.erase(request_id);
  }
  cv_.notify_all();
}

bool LayerTracker::IsLanded(uint64_t request_id, int layer) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(request_id);
  return it != entries_.end() && layer >= 0 && layer < int(it->second.landed.size()) &&
         it->second.landed[layer];
}

bool LayerTracker::AllLanded(uint64_t request_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(request_id);
  if (it == entries_.end() || !it->second.failure.ok()) return false;
  for (bool b : it->second.landed)
    if (!b) return false;
  return true;
}

bool LayerTracker::Settled(uint64_t request_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(request_id);
  if (it == entries_.end() || !it->second.failure.ok()) return true;
  for (bool b : it->second.landed)
    if (!b) return false;
  return true;
}

size_t LayerTracker::active() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

uint64_t LayerTracker::ignored_signals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ignored_;
}

}  // namespace kvstream::connector
