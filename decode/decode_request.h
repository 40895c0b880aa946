// DecodeServer::Request: one Generate call's state, from Submit to its end, shared by the
// handler (or the HTTP front end) that made it and the scheduler thread. Fields above "Scheduler-
// thread state" are set before the request is shared and never change (tier_tokens, prefetch and
// remote aside: the scheduler's once it has the request); `out`, `complete` and `final` are
// guarded by `mu`.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "decode/decode_server.h"
#include "kvcache/pool_tier.h"
#include "tokenizer/text_stream.h"

namespace kvstream::decode {

struct DecodeServer::Request {
  uint64_t id = 0;
  std::string tag;
  std::vector<int32_t> prompt;
  int max_tokens = 1;
  std::vector<int32_t> stop;
  model::SamplingParams sampling;
  bool remote = false;     // KV of prompt[0, n-1) comes from the prefill
  // KV of prompt[0, tier_tokens) loaded from the decode's own tiers (decode/kv_tiers.h), the
  // prefill writing only the rest; on a GPU pool its copies may still be in flight (prefetch).
  int tier_tokens = 0;
  // The root of the prompt's prefix keys: the daemon's, or salted by the request's cache_salt.
  kvcache::BlockKey kv_root{};
  std::string cache_salt;
  std::unique_ptr<kvcache::PoolPrefetch> prefetch;
  // The prefill that loads it (remote only); set before the request is shared, never changed.
  connector::DecodeConnector* conn = nullptr;
  bool pipelined = true;
  Deadline deadline;
  Deadline load_deadline;
  Clock::time_point arrival;
  std::shared_ptr<model::BlockLease> blocks;
  // Scheduler-thread state.
  int32_t cache_len = 0;
  int32_t last_token = -1;
  int generated = 0;
  bool load_info_sent = false;
  int64_t last_token_us = 0;  // since arrival, of the last token emitted
  v1::LoadInfo load;
  std::vector<int32_t> answer;  // the tokens emitted, with a write-down only
  std::unique_ptr<tokenizer::TextStream> text;  // with a tokenizer: the response text
  // Shared with the Generate handler (under mu).
  std::mutex mu;
  std::condition_variable cv;
  std::deque<v1::GenerateResponse> out;
  bool complete = false;
  Status final;
  std::atomic<bool> client_gone{false};
  std::function<void()> on_output;  // Submit's; scheduler thread only
};

}  // namespace kvstream::decode
