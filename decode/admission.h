// FIFO admission to the decode's KV pool: requests take their blocks first come, first served.
//
// Guarantees:
//  - Acquire(need) takes the blocks at once when nobody waits and they are free; otherwise the
//    caller waits in line: only the first in line allocates (as soon as `need` blocks are
//    free), so a large request is never overtaken by smaller ones that arrived after it.
//  - At most max_queue callers wait; one more is refused at once with kResourceExhausted
//    ("admission queue full"). A caller still waiting at its deadline leaves the line with
//    kResourceExhausted ("KV pool full ..."), one whose `cancelled()` turns true with kCanceled,
//    and every caller, waiting or new, gets kUnavailable once Close() was called.
//  - A caller leaving the line (any way) lets the next one move up at once.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/time.h"
#include "model/kv_cache.h"

namespace kvstream::decode {

class Admission {
 public:
  Admission(model::BlockAllocator* allocator, int max_queue)
      : allocator_(allocator), max_queue_(max_queue) {}

  Result<std::vector<int32_t>> Acquire(int need, Deadline deadline,
                                       const std::function<bool()>& cancelled);
  // From now on every Acquire, waiting or new, ends with kUnavailable(why).
  void Close(std::string why);
  int waiting() const;

 private:
  model::BlockAllocator* allocator_;
  const int max_queue_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<uint64_t> line_;  // tickets, first in line at the front
  uint64_t next_ticket_ = 1;
  bool closed_ = false;
  std::string closed_why_;
};

}  // namespace kvstream::decode
