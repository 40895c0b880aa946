#include "decode/join_budget.h"

#include <cmath>

namespace kvstream::decode {

JoinBudget::JoinBudget(double target_step_s, double weight_bytes, double ewma_weight)
    : target_s_(target_step_s > 0 && std::isfinite(target_step_s) ? target_step_s : 0),
      weight_bytes_(weight_bytes > 0 ? weight_bytes : 0),
      alpha_(ewma_weight > 0 && ewma_weight <= 1 ? ewma_weight : 0.2) {}

size_t JoinBudget::Admit(double running_kv_bytes, std::span<const double> candidate_kv_bytes) {
  const size_t n = candidate_kv_bytes.size();
  if (n == 0) return 0;  // admitted_last_ keeps its value: a step without candidates says nothing
  size_t k = n;
  if (target_s_ > 0 && seconds_per_byte_ > 0) {
    double bytes = weight_bytes_ + running_kv_bytes;
    k = 0;
    while (k < n && seconds_per_byte_ * (bytes + candidate_kv_bytes[k]) <= target_s_)
      bytes += candidate_kv_bytes[k++];
    // Progress: one joiner every other step at least, even when the batch alone is over.
    if (k == 0 && !admitted_last_) k = 1;
  }
  admitted_last_ = k > 0;
  return k;
}

void JoinBudget::Observe(double seconds, double kv_bytes) {
  const double bytes = weight_bytes_ + kv_bytes;
  if (!(std::isfinite(seconds) && seconds > 0 && std::isfinite(bytes) && bytes > 0)) return;
  const double s = seconds / bytes;
  seconds_per_byte_ = seconds_per_byte_ == 0 ? s : (1 - alpha_) * seconds_per_byte_ + alpha_ * s;
}

}  // namespace kvstream::decode
