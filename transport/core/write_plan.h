// Backend-side write planning shared by every transport backend (not part of the public API):
// validation of a WriteRequest against the local and remote regions, and coalescing of
// adjacent CopyOps into contiguous runs.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "transport/transport.h"

namespace kvstream::transport::internal {

// A contiguous transfer: the same fields as a CopyOp.
using Run = CopyOp;

struct WritePlan {
  std::vector<Run> runs;  // in request order; zero-length ops dropped
  uint64_t bytes = 0;
};

// Checks every op against [0, local_length) and [0, remote_length) (overflow-safe) and merges
// an op into the previous run when it continues it on both sides. Ops are not reordered:
// overlapping destinations keep the caller's order.
Result<WritePlan> PlanWrite(const std::vector<CopyOp>& ops, uint64_t local_length,
                            uint64_t remote_length);

// Checks the parts of a request every backend checks the same way: a local registration is
// given and remote_region indexes `num_remote_regions`.
Status CheckRequestShape(const WriteRequest& request, size_t num_remote_regions);

// Appends `op` to `runs`, merged into the last run when it continues it on both sides.
void AppendCoalesced(std::vector<Run>& runs, const CopyOp& op);

}  // namespace kvstream::transport::internal
