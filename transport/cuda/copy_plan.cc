#include "transport/cuda/copy_plan.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace kvstream::transport::cuda {

namespace {

// Both planners' bound check: op i must lie inside both regions (overflow-safe).
Status CheckOpInRegions(const CopyOp& op, size_t i, uint64_t local_len, uint64_t remote_len) {
  if (op.local_offset > local_len || op.length > local_len - op.local_offset ||
      op.remote_offset > remote_len || op.length > remote_len - op.remote_offset) {
    return InvalidArgument("cuda_ipc Write: op " + std::to_string(i) + " (local " +
                           std::to_string(op.local_offset) + ", remote " +
                           std::to_string(op.remote_offset) + ", length " +
                           std::to_string(op.length) + ") lies outside the regions (" +
                           std::to_string(local_len) + " local, " +
                           std::to_string(remote_len) + " remote bytes)");
  }
  return OkStatus();
}

}  // namespace

Status CopyPlanner::Build(const std::vector<CopyOp>& ops, uint64_t local_base, uint64_t local_len,
                          uint64_t remote_base, uint64_t remote_len) {
  runs_.clear();
  bytes_ = 0;
  disjoint_ = true;
  if (runs_.capacity() < ops.size()) runs_.reserve(ops.size());
  bool sorted = true;  // by destination, the common case (a request's blocks in pool order)
  for (size_t i = 0; i < ops.size(); ++i) {
    const CopyOp& op = ops[i];
    if (Status st = CheckOpInRegions(op, i, local_len, remote_len); !st.ok()) {
      runs_.clear();
      bytes_ = 0;
      return st;
    }
    if (op.length == 0) continue;
    const CopyRun r{local_base + op.local_offset, remote_base + op.remote_offset, op.length};
    bytes_ += op.length;
    if (!runs_.empty()) {
      CopyRun& last = runs_.back();
      if (last.src + last.length == r.src && last.dst + last.length == r.dst) {
        last.length += r.length;
        continue;
      }
      if (r.dst < last.dst + last.length) {
        sorted = false;
        // Sorted-order overlap check below; an overlap with the previous run is certain here
        // when r starts inside it.
        if (r.dst >= last.dst) disjoint_ = false;
      }
    }
    runs_.push_back(r);
  }
  if (!sorted && disjoint_ && runs_.size() >= 2 && !CheckDisjointByGranules()) {
    sorted_.assign(runs_.begin(), runs_.end());
    std::sort(sorted_.begin(), sorted_.end(),
              [](const CopyRun& a, const CopyRun& b) { return a.dst < b.dst; });
    for (size_t i = 1; i < sorted_.size(); ++i) {
      if (sorted_[i - 1].dst + sorted_[i - 1].length > sorted_[i].dst) {
        disjoint_ = false;
        break;
      }
    }
  }
  return OkStatus();
}

bool CopyPlanner::CheckDisjointByGranules() {
  // A paged pool's blocks: every run starts and ends on a multiple of a large power of two G
  // (the block size, or more). Marking each run's granules in a bitmap over the destination span
  // finds any overlap in O(runs + bytes / G), where sorting random-order runs cost several us.
  uint64_t lo = runs_[0].dst, hi = 0, bits = 0;
  for (const CopyRun& r : runs_) {
    lo = std::min(lo, r.dst);
    hi = std::max(hi, r.dst + r.length);
  }
  for (const CopyRun& r : runs_) bits |= (r.dst - lo) | r.length;
  if (bits == 0) return false;
  const int shift = __builtin_ctzll(bits);
  const uint64_t granules = (hi - lo) >> shift;
  if (granules > kMaxGranules || (bytes_ >> shift) > kMaxGranules) return false;  // sort instead
  granule_bits_.assign((granules + 63) / 64, 0);
  for (const CopyRun& r : runs_) {
    uint64_t g = (r.dst - lo) >> shift;
    const uint64_t end = g + (r.length >> shift);
    for (; g < end; ++g) {
      uint64_t& w = granule_bits_[g >> 6];
      const uint64_t m = 1ull << (g & 63);
      if (w & m) {
        disjoint_ = false;
        return true;
      }
      w |= m;
    }
  }
  return true;
}

Status BlockPlanner::Build(const std::vector<CopyOp>& ops, uint64_t local_base,
                           uint64_t local_len, uint64_t remote_base, uint64_t remote_len,
                           size_t max_entries) {
  entries_.clear();
  fits_ = false;
  unit_ = 0;
  bytes_ = 0;
  runs_ = 0;
  // Pass 1: validate, the common power-of-two unit, bytes and coalesced runs.
  // Units are counted from the bases, so the bases need only the kernel's 16-byte alignment.
  uint64_t bits = 0;
  uint64_t prev_l = ~0ull, prev_r = ~0ull;  // end of the previous non-empty op
  for (size_t i = 0; i < ops.size(); ++i) {
    const CopyOp& op = ops[i];
    if (Status st = CheckOpInRegions(op, i, local_len, remote_len); !st.ok()) {
      bytes_ = 0;
      runs_ = 0;
      return st;
    }
    if (op.length == 0) continue;
    bits |= op.local_offset | op.remote_offset | op.length;
    bytes_ += op.length;
    if (op.local_offset != prev_l || op.remote_offset != prev_r) ++runs_;
    prev_l = op.local_offset + op.length;
    prev_r = op.remote_offset + op.length;
  }
  if (bytes_ == 0) return OkStatus();
  // The unit: the largest power of two dividing every base, offset and length (capped so one
  // unit's 16-byte words fit 32 bits).
  const int shift = std::min(__builtin_ctzll(bits), 35);
  if (shift < 4 || ((local_base | remote_base) & 15u) != 0) return OkStatus();  // not 16-B aligned
  const uint64_t units = bytes_ >> shift;
  if (units > max_entries || (local_len >> shift) > 0xffffffffull ||
      (remote_len >> shift) > kMaxBitmapUnits) {
    return OkStatus();
  }
  // Pass 2: the entries, and the overlap check on a bitmap of destination units.
  const size_t words = static_cast<size_t>(((remote_len >> shift) + 64) / 64);
  if (bitmap_.size() < words) bitmap_.resize(words, 0);
  entries_.resize(static_cast<size_t>(units));
  BlockEntry* e = entries_.data();
  bool overlap = false;
  for (const CopyOp& op : ops) {
    if (op.length == 0) continue;
    const uint32_t s = static_cast<uint32_t>(op.local_offset >> shift);
    const uint32_t d = static_cast<uint32_t>(op.remote_offset >> shift);
    const uint32_t m = static_cast<uint32_t>(op.length >> shift);
    for (uint32_t j = 0; j < m; ++j) {
      const uint32_t du = d + j;
      uint64_t& w = bitmap_[du >> 6];
      const uint64_t bit = 1ull << (du & 63);
      overlap |= (w & bit) != 0;
      w |= bit;
      *e++ = {s + j, du};
    }
  }
  for (const BlockEntry& x : entries_) bitmap_[x.dst >> 6] = 0;  // back to all zero
  if (overlap) {
    entries_.clear();
    return OkStatus();
  }
  unit_ = 1ull << shift;
  fits_ = true;
  return OkStatus();
}

ScatterShape PlanScatter(const CopyRun* runs, size_t n) {
  ScatterShape s;
  if (n == 0) return s;
  uint64_t total = 0, longest = 0;
  for (size_t i = 0; i < n; ++i) {
    total += runs[i].length;
    longest = std::max(longest, runs[i].length);
  }
  uint64_t piece = kScatterPieceBytes;
  while (piece > kMinPieceBytes && total / piece < kTargetCtas) piece /= 2;
  s.piece_bytes = piece;
  const uint64_t ppr = (longest + piece - 1) / piece;
  s.pieces_per_run = ppr > 0xFFFFFFFFull ? 0xFFFFFFFFu : static_cast<uint32_t>(ppr);
  s.ctas = static_cast<uint64_t>(n) * ppr;
  uint64_t useful = 0;
  for (size_t i = 0; i < n; ++i) useful += (runs[i].length + piece - 1) / piece;
  s.wasted = s.ctas - useful;
  return s;
}

bool ScatterShapeWasteful(const ScatterShape& shape) {
  // grid.y is limited to 65535; beyond a third of empty CTAs the host-side split is cheaper.
  return shape.pieces_per_run > 65535 || shape.wasted * 3 > shape.ctas;
}

CopyPath ChooseCopyPath(size_t runs, bool disjoint, bool force_memcpy, bool force_kernel,
                        size_t kernel_min_runs, const ScatterShape& shape) {
  if (runs == 0 || force_memcpy || !disjoint) return CopyPath::kMemcpy;
  if (!force_kernel && runs < kernel_min_runs) return CopyPath::kMemcpy;
  return ScatterShapeWasteful(shape) ? CopyPath::kKernelSplit : CopyPath::kKernel;
}

bool RunRing::Reserve(uint64_t entries, uint64_t* start) {
  if (entries == 0 || entries > capacity_) return false;
  uint64_t head = head_;
  const uint64_t pos = head % capacity_;
  if (pos + entries > capacity_) head += capacity_ - pos;  // no wrap inside one table
  if (head + entries - tail_ > capacity_) return false;
  *start = head;
  head_ = head + entries;
  return true;
}


size_t ScatterTableEntries(const CopyRun* runs, size_t n) {
  size_t entries = 0;
  for (size_t i = 0; i < n; ++i) {
    entries += (runs[i].length + kScatterPieceBytes - 1) / kScatterPieceBytes;
  }
  return entries;
}

size_t SplitRuns(const CopyRun* runs, size_t n, CopyRun* table) {
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    for (uint64_t off = 0; off < runs[i].length; off += kScatterPieceBytes) {
      uint64_t len = runs[i].length - off;
      if (len > kScatterPieceBytes) len = kScatterPieceBytes;
      table[k++] = CopyRun{runs[i].src + off, runs[i].dst + off, len};
    }
  }
  return k;
}

bool PackRuns(const CopyRun* runs, size_t n, uint64_t split_bytes, PackedTable* out) {
  out->clear();
  constexpr uint64_t kMaxUnits = 0xffffffffull;
  if (split_bytes % 16 != 0) return false;
  for (size_t i = 0; i < n; ++i) {
    if (((runs[i].src | runs[i].dst | runs[i].length) & 15u) != 0) return false;
  }
  // Runs as they are, or first cut into pieces of at most split_bytes.
  const CopyRun* pieces = runs;
  size_t count_all = n;
  if (split_bytes != 0) {
    out->pieces.clear();
    for (size_t i = 0; i < n; ++i) {
      const CopyRun& r = runs[i];
      for (uint64_t off = 0; off < r.length; off += split_bytes) {
        out->pieces.push_back({r.src + off, r.dst + off, std::min(split_bytes, r.length - off)});
      }
    }
    pieces = out->pieces.data();
    count_all = out->pieces.size();
  }
  out->runs.resize(count_all);
  for (size_t first = 0; first < count_all; first += kParamTableCapacity) {
    const size_t count = std::min(kParamTableCapacity, count_all - first);
    PackedTable::Chunk c;
    c.first = first;
    c.count = count;
    c.src_base = pieces[first].src;
    c.dst_base = pieces[first].dst;
    for (size_t i = first; i < first + count; ++i) {
      c.src_base = std::min(c.src_base, pieces[i].src);
      c.dst_base = std::min(c.dst_base, pieces[i].dst);
    }
    for (size_t i = first; i < first + count; ++i) {
      const CopyRun& r = pieces[i];
      const uint64_t s16 = (r.src - c.src_base) / 16, d16 = (r.dst - c.dst_base) / 16;
      const uint64_t l16 = r.length / 16;
      if (s16 > kMaxUnits || d16 > kMaxUnits || l16 > kMaxUnits) {
        out->clear();
        return false;
      }
      out->runs[i] = {static_cast<uint32_t>(s16), static_cast<uint32_t>(d16),
                      static_cast<uint32_t>(l16)};
      c.longest16 = std::max(c.longest16, l16);
      c.bytes += r.length;
      out->bytes += r.length;
    }
    out->chunks.push_back(c);
  }
  return true;
}

uint64_t ParamSplitBytes(const CopyRun* runs, size_t n, const ParamKernelConfig& cfg) {
  if (n == 0) return 0;
  uint64_t total = 0, longest = 0;
  for (size_t i = 0; i < n; ++i) {
    total += runs[i].length;
    longest = std::max(longest, runs[i].length);
  }
  const uint64_t piece = cfg.piece_bytes != 0 ? cfg.piece_bytes : PlanPieceBytes(total, cfg);
  // Even enough: the longest run's pieces are at most ~4x the mean run's. Else cut on the host.
  return longest > 4 * (total / n) + piece ? piece : 0;
}

bool ParseParamKernelConfig(const char* text, ParamKernelConfig* out) {
  ParamKernelConfig c = *out;
  const char* p = text;
  while (*p != 0) {
    const char key = *p++;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(p, &end, 10);
    if (end == p) return false;
    p = end;
    switch (key) {
      case 't': c.threads = static_cast<int>(v); break;
      case 'u': c.unroll = static_cast<int>(v); break;
      case 'p': c.piece_bytes = v * 1024; break;
      case 'c': c.max_ctas = static_cast<uint32_t>(v); break;
      default: return false;
    }
  }
  if (!kernels::ScatterKernelShapeSupported(c.threads, c.unroll)) return false;
  *out = c;
  return true;
}

}  // namespace kvstream::transport::cuda
