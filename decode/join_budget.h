// JoinBudget: how many landed prompts may take their first step in the next decode step, so
// that the step stays within the decode's inter-token-latency target (itl_target_ms).
//
// Why: a landed prompt's first step reads its whole KV (a 16k-token llama-3-8b prompt: 2 GiB)
// inside the running streams' step. The decode step is bound by HBM bytes (weights + every
// sequence's KV; bench/decode_step measured time/base within 1-5% of bytes/base), so a burst of
// landed prompts joining one step stretches that step - the running streams' inter-token
// latency - by their bytes, whatever rate the transfer was paced at. The budget admits joiners
// in arrival order while the predicted step time stays within the target.
//
// Model: step time = seconds_per_byte x (weight bytes + KV bytes of every sequence), where
// seconds_per_byte is learned from the steps the scheduler actually ran (an exponential moving
// average of time / bytes, so contention from transfers and the kernel's efficiency at this
// batch are in it). Until a step has been observed nothing is limited.
//
// Guarantees:
//  - Admit() never returns more than the number of candidates. Without a target, or before
//    the first Observe(), it admits them all. With a target it admits at least one when no
//    joiner was admitted in the previous step that had candidates (progress: landed prompts
//    keep joining, one every other step at worst, even when the running batch alone exceeds
//    the target).
//  - Candidates are admitted as a prefix (arrival order is kept).
//  - Observe() ignores non-positive or non-finite samples.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvstream::decode {

class JoinBudget {
 public:
  // target_step_s <= 0: no limit. weight_bytes: bytes of weights one step reads.
  JoinBudget(double target_step_s, double weight_bytes, double ewma_weight = 0.2);

  // running_kv_bytes: KV bytes the running batch reads this step; candidate_kv_bytes: each
  // landed candidate's KV bytes (its first step reads them all), in arrival order.
  size_t Admit(double running_kv_bytes, std::span<const double> candidate_kv_bytes);
  // A step ran: `seconds` (the scheduler iteration, what the streams' ITL sees) for `kv_bytes`
  // of KV (all sequences, joiners included).
  void Observe(double seconds, double kv_bytes);

  double seconds_per_byte() const { return seconds_per_byte_; }
  bool limited() const { return target_s_ > 0; }

 private:
  double target_s_;
  double weight_bytes_;
  double alpha_;
  double seconds_per_byte_ = 0;  // 0 = nothing observed yet
  bool admitted_last_ = false;
};

}  // namespace kvstream::decode
