#include <algorithm>

#include "connector/prefill_connector.h"

namespace kvstream::connector {

std::vector<transport::CopyOp> LayerCopyOps(const model::KvLayout& layout, int layer,
                                            int local_pool_blocks,
                                            const std::vector<int32_t>& local_blocks,
                                            int remote_pool_blocks,
                                            const std::vector<int32_t>& remote_blocks) {
  std::vector<transport::CopyOp> ops;
  const uint64_t bb = layout.block_bytes();
  const size_t n = std::min(local_blocks.size(), remote_blocks.size());
  for (size_t i = 0; i < n; ++i) {
    uint64_t lo = layout.block_offset(local_pool_blocks, layer, local_blocks[i]);
    uint64_t ro = layout.block_offset(remote_pool_blocks, layer, remote_blocks[i]);
    if (!ops.empty() && ops.back().local_offset + ops.back().length == lo &&
        ops.back().remote_offset + ops.back().length == ro) {
      ops.back().length += bb;
    } else {
      ops.push_back(transport::CopyOp{lo, ro, bb});
    }
  }
  return ops;
}

}  // namespace kvstream::connector
