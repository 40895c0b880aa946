// LoadHooks: the decode's model hooks for a request whose KV the prefill streams in. Before each
// layer's attention of the last prompt token it waits for that layer to land (wait_for_layer),
// on the host or, with gpu_wait, on the compute stream; every wait carries the request's load
// deadline, so a lost prefill ends the forward with an error instead of a hang.
#pragma once

#include <chrono>
#include <cstdint>

#include "common/time.h"
#include "connector/decode_connector.h"
#include "daemon/metrics.h"
#include "model/backend.h"

namespace kvstream::decode {

class LoadHooks : public model::LayerHooks {
 public:
  // all_layers_first: wait for every layer before layer 0 (see DaemonConfig::first_step_after_load).
  // gpu_wait (DaemonConfig::gpu_landed_wait): layers announced early are waited for on
  // `stream` (the compute stream) rather than on the host.
  // `observe` (may be null): each wait's duration, one per BeforeAttention.
  LoadHooks(connector::DecodeConnector* c, uint64_t id, Deadline deadline, int num_layers,
            bool all_layers_first, bool gpu_wait, daemon::Histogram* observe)
      : c_(c), id_(id), deadline_(deadline), num_layers_(num_layers),
        all_layers_first_(all_layers_first), gpu_wait_(gpu_wait), observe_(observe) {}
  Status BeforeAttention(int layer, void* stream) override {
    auto t = Clock::now();
    auto wait = [&](int l) {
      return gpu_wait_ ? c_->WaitForLayerOnStream(id_, l, stream, deadline_)
                       : c_->WaitForLayer(id_, l, deadline_);
    };
    Status s;
    if (all_layers_first_ && layer == 0) {
      for (int l = 0; l < num_layers_ && s.ok(); ++l) s = wait(l);
    } else {
      s = wait(layer);
    }
    const int64_t us =
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t).count();
    wait_us += us;
    if (observe_) observe_->Observe(double(us) * 1e-6);
    return s;
  }
  int64_t wait_us = 0;

 private:
  connector::DecodeConnector* c_;
  uint64_t id_;
  Deadline deadline_;
  int num_layers_;
  bool all_layers_first_;
  bool gpu_wait_;
  daemon::Histogram* observe_;
};

}  // namespace kvstream::decode
