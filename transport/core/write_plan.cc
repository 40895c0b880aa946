#include "transport/core/write_plan.h"

#include <string>

namespace kvstream::transport::internal {

namespace {
bool FitsIn(uint64_t offset, uint64_t length, uint64_t limit) {
  return offset <= limit && length <= limit - offset;
}
}  // namespace

Result<WritePlan> PlanWrite(const std::vector<CopyOp>& ops, uint64_t local_length,
                            uint64_t remote_length) {
  WritePlan plan;
  plan.runs.reserve(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    const CopyOp& op = ops[i];
    if (!FitsIn(op.local_offset, op.length, local_length)) {
      return InvalidArgument("op " + std::to_string(i) + ": local range [" +
                             std::to_string(op.local_offset) + ", +" + std::to_string(op.length) +
                             ") is past the local registration (" + std::to_string(local_length) +
                             " bytes)");
    }
    if (!FitsIn(op.remote_offset, op.length, remote_length)) {
      return InvalidArgument("op " + std::to_string(i) + ": remote range [" +
                             std::to_string(op.remote_offset) + ", +" + std::to_string(op.length) +
                             ") is past the remote region (" + std::to_string(remote_length) +
                             " bytes)");
    }
    if (op.length == 0) continue;
    plan.bytes += op.length;
    AppendCoalesced(plan.runs, op);
  }
  return plan;
}

void AppendCoalesced(std::vector<Run>& runs, const CopyOp& op) {
  if (!runs.empty()) {
    Run& last = runs.back();
    if (last.local_offset + last.length == op.local_offset &&
        last.remote_offset + last.length == op.remote_offset) {
      last.length += op.length;
      return;
    }
  }
  runs.push_back(op);
}

Status CheckRequestShape(const WriteRequest& request, size_t num_remote_regions) {
  if (request.local == nullptr) return InvalidArgument("write without a local registration");
  if (request.remote_region < 0 ||
      static_cast<size_t>(request.remote_region) >= num_remote_regions) {
    return InvalidArgument("remote region index " + std::to_string(request.remote_region) +
                           " out of range (peer has " + std::to_string(num_remote_regions) +
                           " regions)");
  }
  return OkStatus();
}

}  // namespace kvstream::transport::internal
