// disk_tier: the disk tier's (L3, kvcache/disk_tier.h) write-down and read rates, beside fio on
// the same folder in the same run (issue 16: disk reads >= 0.8 of `fio --direct=1` sequential
// read at the same block size and queue depth). A CPU program; the steps, in order:
//   1. write: --blocks entries of one block each (default llama-3-8b: 32 layers x 2 x 8 KV
//      heads x 128 x f16 x 16 tokens = 2 MiB of KV) written down through a TieredCache over a
//      host pool with the disk tier alone and --write_threads writers (TieredCache's); MB/s of
//      entry bytes from the first WriteDown until Flush returns. The tier does not fsync: this
//      is the rate the writers hand entries to the kernel.
//   2. cold: every entry's pages leave the page cache: each file fdatasync'ed, then
//      posix_fadvise(POSIX_FADV_DONTNEED) (default), or `sync; echo 3 > /proc/sys/vm/drop_caches`
//      (--drop_caches, root); the pages still resident afterwards are counted with mincore.
//   3. read: --qd threads each DiskTier::Get (open, read, CRC + identity + HMAC verified, copied
//      into the layers) every qd-th block in write order; MB/s of entry bytes and the process's
//      CPU ms per entry. Reads are O_DIRECT (the tier's default) or, with --buffered, through
//      the page cache; a last pass "again" reads what the cold passes left cached (buffered: the
//      verification's own rate).
//   4. fio (--fio, default `fio` on PATH; missing: said, exit 3): `fio --direct=1 --rw=read
//      --bs=<entry bytes rounded up to 4 KiB> --iodepth=<qd> --ioengine=libaio --numjobs=1
//      --size=<blocks x bs>` on one file in the same folder (removed at the end).
//   Steps 2-4 run --reps times (default 3), interleaved, so a load that comes and goes on a
//   shared machine hits both alike; the ratio is of the medians. Then once: fio with
//   --ioengine=psync --iodepth=1 --numjobs=<qd> (qd files: Q synchronous readers, as the tier's).
// One JSON line with every figure (--json FILE appends it too).
//
//   disk_tier --dir D [--blocks 512] [--layers 32] [--kv_heads 8] [--head_dim 128]
//             [--block_size 16] [--write_threads 4] [--qd 4] [--reps 3] [--drop_caches] [--fio PATH]
//             [--buffered] [--json FILE] [--keep]
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvcache/disk_tier.h"
#include "kvcache/pool_tier.h"
#include "kvcache/tiered_cache.h"
#include "model/kv_cache.h"

namespace {

using namespace kvstream;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string dir, fio = "fio", json;
  int blocks = 512, layers = 32, kv_heads = 8, head_dim = 128, block_size = 16;
  int write_threads = 4, qd = 4, reps = 3;
  bool drop_caches = false, keep = false, buffered = false;
};

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (k == "--dir") a->dir = val();
    else if (k == "--blocks") a->blocks = std::atoi(val().c_str());
    else if (k == "--layers") a->layers = std::atoi(val().c_str());
    else if (k == "--kv_heads") a->kv_heads = std::atoi(val().c_str());
    else if (k == "--head_dim") a->head_dim = std::atoi(val().c_str());
    else if (k == "--block_size") a->block_size = std::atoi(val().c_str());
    else if (k == "--write_threads") a->write_threads = std::atoi(val().c_str());
    else if (k == "--qd") a->qd = std::atoi(val().c_str());
    else if (k == "--reps") a->reps = std::atoi(val().c_str());
    else if (k == "--drop_caches") a->drop_caches = true;
    else if (k == "--fio") a->fio = val();
    else if (k == "--json") a->json = val();
    else if (k == "--keep") a->keep = true;
    else if (k == "--buffered") a->buffered = true;
    else {
      std::fprintf(stderr, "disk_tier: unknown flag %s\n", k.c_str());
      return false;
    }
  }
  if (a->dir.empty() || a->blocks < 1 || a->layers < 1 || a->kv_heads < 1 || a->head_dim < 1 ||
      a->block_size < 1 || a->write_threads < 1 || a->qd < 1 || a->reps < 1) {
    std::fprintf(stderr, "disk_tier: --dir D is required; counts must be >= 1\n");
    return false;
  }
  return true;
}

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<std::string> EntryFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".kvb") out.push_back(e.path().string());
  return out;
}

// Drops the files' pages from the page cache; returns the fraction of their pages still resident.
double DropFromPageCache(const std::vector<std::string>& files, bool drop_caches, std::string* how) {
  for (const std::string& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    if (!drop_caches) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  *how = "fdatasync + posix_fadvise(DONTNEED) per file";
  if (drop_caches) {
    ::sync();
    std::ofstream dc("/proc/sys/vm/drop_caches");
    dc << "3\n";
    dc.flush();
    *how = dc.good() ? "sync; echo 3 > /proc/sys/vm/drop_caches"
                     : "drop_caches FAILED (not root?): pages only fdatasync'ed";
  }
  const long page = ::sysconf(_SC_PAGESIZE);
  uint64_t resident = 0, total = 0;
  for (const std::string& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st {};
    if (::fstat(fd, &st) == 0 && st.st_size > 0) {
      void* m = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
      if (m != MAP_FAILED) {
        std::vector<unsigned char> vec((size_t(st.st_size) + page - 1) / page);
        if (::mincore(m, size_t(st.st_size), vec.data()) == 0)
          for (unsigned char v : vec) resident += v & 1;
        total += vec.size();
        ::munmap(m, size_t(st.st_size));
      }
    }
    ::close(fd);
  }
  return total ? double(resident) / double(total) : 0.0;
}

// Runs fio; its read bandwidth in bytes/s, or < 0 (message printed).
double RunFio(const Args& a, const std::string& extra, uint64_t size, uint64_t bs, std::string* cmd) {
  *cmd = a.fio + " --name=kvstream_disk_tier --directory=" + a.dir + " --rw=read --bs=" +
         std::to_string(bs) + " --size=" + std::to_string(size) +
         " --direct=1 --group_reporting --output-format=json " + extra;
  FILE* p = ::popen((*cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  const int rc = ::pclose(p);
  const size_t brace = out.find('{');
  if (rc != 0 || brace == std::string::npos) {
    std::fprintf(stderr, "disk_tier: fio failed (rc %d): %s\n", rc, out.substr(0, 2000).c_str());
    return -1;
  }
  try {
    const auto j = nlohmann::json::parse(out.substr(brace));
    return j.at("jobs").at(0).at("read").at("bw_bytes").get<double>();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "disk_tier: fio output not understood: %s\n", e.what());
    return -1;
  }
}

void RemoveFioFiles(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("kvstream_disk_tier.", 0) == 0) fs::remove(e.path());
}

double CpuSeconds() {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? -1 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

bool FioFound(const std::string& fio) {
  if (fio.find('/') != std::string::npos) return ::access(fio.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "";
  for (size_t s = 0, e; s <= p.size(); s = e + 1) {
    e = p.find(':', s);
    if (e == std::string::npos) e = p.size();
    if (::access((p.substr(s, e - s) + "/" + fio).c_str(), X_OK) == 0) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!ParseArgs(argc, argv, &a)) return 2;
  model::KvLayout layout;
  layout.num_layers = a.layers;
  layout.num_kv_heads = a.kv_heads;
  layout.head_dim = a.head_dim;
  layout.block_size = a.block_size;
  const uint64_t entry = kvcache::EncodedBlockBytes(layout);
  const uint64_t total = entry * uint64_t(a.blocks);
  const uint64_t model_hash = 0x6b7673747265616dull;
  const kvcache::BlockKey root = kvcache::RootKey(model_hash, layout, "");
  std::printf("disk_tier: %d entries of %llu bytes (%d layers x %zu bytes of KV + %zu), %.1f MiB, in %s\n",
              a.blocks, (unsigned long long)entry, a.layers, layout.block_bytes(),
              kvcache::kBlockHeaderBytes + kvcache::kBlockTrailerBytes, double(total) / (1 << 20),
              a.dir.c_str());

  kvcache::DiskTier::Options o;
  o.dir = a.dir;
  o.identity = {root, layout};
  o.model_hash = model_hash;
  o.secret = "disk-tier-bench-cluster-secret-0123456789";
  o.capacity_bytes = total + entry;
  o.erase_at_open = true;
  o.direct_reads = !a.buffered;
  auto disk_or = kvcache::DiskTier::Open(o);
  if (!disk_or.ok()) {
    std::fprintf(stderr, "disk_tier: %s\n", disk_or.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<kvcache::DiskTier> disk = std::move(disk_or).value();

  // 1. The write-down: prompts of 16 blocks from one set of pool blocks (random KV), each
  // prompt its own tokens (so its own keys); at most half the pool queued (TieredCache's bound).
  constexpr int kPromptBlocks = 16, kPoolBlocks = 128;
  auto pool = model::CreateHostPool(layout, kPoolBlocks).value();
  model::BlockLease src(&pool->allocator(), {});
  if (!src.GrowToTokens(kPromptBlocks * a.block_size, a.block_size).ok()) return 1;
  std::mt19937_64 rng(1);
  for (int32_t id : src.ids())
    for (int l = 0; l < a.layers; ++l) {
      auto* p = reinterpret_cast<uint64_t*>(pool->block_ptr(l, id));
      for (size_t i = 0; i < layout.block_bytes() / 8; ++i) p[i] = rng();
    }
  std::vector<std::vector<int32_t>> prompts;
  for (int left = a.blocks, p = 0; left > 0; left -= kPromptBlocks, ++p) {
    std::vector<int32_t> t(size_t(std::min(left, kPromptBlocks) * a.block_size));
    std::iota(t.begin(), t.end(), 1000000 * (p + 1));
    prompts.push_back(std::move(t));
  }
  double write_s = 0, write_cpu_ms = 0;
  kvcache::TierStats ws;
  uint64_t skipped = 0;
  {
    std::vector<std::unique_ptr<kvcache::KvTier>> tiers;
    tiers.push_back(std::make_unique<kvcache::BorrowedTier>(disk.get()));
    kvcache::TieredCache tc(pool.get(), model_hash, std::move(tiers), {}, /*io_threads=*/0,
                            /*staged=*/false, a.write_threads);
    const double cpu0 = CpuSeconds();
    const auto t0 = Clock::now();
    for (const auto& t : prompts) {
      while (tc.stats().queued_writes + kPromptBlocks > kPoolBlocks / 2)
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      tc.WriteDown(root, t, src.ids());
    }
    tc.Flush();
    write_s = Seconds(t0);
    write_cpu_ms = (CpuSeconds() - cpu0) * 1e3 / double(a.blocks);
    skipped = tc.stats().skipped_blocks;
  }
  ws = disk->stats();
  const double write_mbs = double(ws.bytes_written) / write_s / 1e6;
  std::printf("write: %llu entries (%llu failed, %llu skipped) in %.3f s: %.1f MB/s with %d writer "
              "threads, %.2f CPU ms per entry\n",
              (unsigned long long)ws.written_blocks, (unsigned long long)ws.write_failures,
              (unsigned long long)skipped, write_s, write_mbs, a.write_threads, write_cpu_ms);
  if (ws.written_blocks != uint64_t(a.blocks)) {
    std::fprintf(stderr, "disk_tier: %llu of %d entries written\n",
                 (unsigned long long)ws.written_blocks, a.blocks);
    return 1;
  }

  // 2-4, --reps times, interleaved (the cold read, then fio at the same size and depth), so
  // that a load that comes and goes on a shared machine hits both alike: medians.
  std::vector<kvcache::BlockKey> keys;
  for (const auto& t : prompts)
    for (const auto& k : kvcache::ChainKeys(root, t, a.block_size)) keys.push_back(k);
  // 3. Reads: qd threads, thread q reading blocks q, q+qd, ... in write order, each verified.
  // Returns MB/s (< 0 when a read failed); `cpu_ms` gets the process's CPU ms per entry read.
  auto read_pass = [&](const char* label, double* cpu_ms) {
    std::atomic<uint64_t> failed{0};
    const double cpu0 = CpuSeconds();
    const auto t0 = Clock::now();
    std::vector<std::thread> th;
    for (int q = 0; q < a.qd; ++q)
      th.emplace_back([&, q] {
        std::vector<std::byte> buf(layout.block_bytes() * size_t(a.layers));
        std::vector<std::span<std::byte>> layers;
        for (int l = 0; l < a.layers; ++l)
          layers.emplace_back(buf.data() + size_t(l) * layout.block_bytes(), layout.block_bytes());
        for (size_t b = size_t(q); b < keys.size(); b += size_t(a.qd))
          if (!disk->Get(keys[b], layers).ok()) ++failed;
      });
    for (auto& t : th) t.join();
    const double s = Seconds(t0);
    *cpu_ms = (CpuSeconds() - cpu0) * 1e3 / double(keys.size());
    const double mbs = double(keys.size() - failed.load()) * double(entry) / s / 1e6;
    std::printf("read %s (%s): %zu entries (%llu failed) in %.3f s: %.1f MB/s at qd %d, %.2f CPU ms per entry\n",
                label, a.buffered ? "buffered" : "O_DIRECT", keys.size(),
                (unsigned long long)failed.load(), s, mbs, a.qd, *cpu_ms);
    return failed.load() == 0 ? mbs : -1.0;
  };
  // 4. fio on the same folder, same block size (rounded up to 4 KiB for O_DIRECT) and depth.
  const uint64_t bs = (entry + 4095) / 4096 * 4096;
  const bool have_fio = FioFound(a.fio);
  if (!have_fio)
    std::printf("fio: '%s' NOT FOUND (apt-get install fio; scripts/install-deps.sh): no ratio\n",
                a.fio.c_str());
  std::string how, cmd_aio, cmd_sync;
  std::vector<double> cold, fio_aio, resident;
  double cpu_ms = 0;
  for (int r = 0; r < a.reps; ++r) {
    // 2. Cold: the entries' pages out of the page cache.
    resident.push_back(DropFromPageCache(EntryFiles(a.dir), a.drop_caches, &how));
    std::printf("page cache: %s; %.2f%% of the entries' pages still resident\n", how.c_str(),
                100.0 * resident.back());
    cold.push_back(read_pass("cold", &cpu_ms));
    if (have_fio) {
      fio_aio.push_back(RunFio(a, "--ioengine=libaio --iodepth=" + std::to_string(a.qd) +
                                      " --numjobs=1",
                               bs * uint64_t(a.blocks), bs, &cmd_aio) / 1e6);
      std::printf("fio libaio: %.1f MB/s  (%s)\n", fio_aio.back(), cmd_aio.c_str());
    }
  }
  double warm_cpu_ms = 0;
  const double warm_mbs = read_pass("again", &warm_cpu_ms);
  double fio_sync = -1;
  if (have_fio) {
    const uint64_t per_job = bs * ((uint64_t(a.blocks) + a.qd - 1) / a.qd);
    fio_sync = RunFio(a, "--ioengine=psync --iodepth=1 --numjobs=" + std::to_string(a.qd), per_job,
                      bs, &cmd_sync) / 1e6;
    std::printf("fio psync:  %.1f MB/s  (%s)\n", fio_sync, cmd_sync.c_str());
  }
  RemoveFioFiles(a.dir);
  const double cold_mbs = Median(cold), aio_mbs = have_fio ? Median(fio_aio) : -1;
  const bool failed = *std::min_element(cold.begin(), cold.end()) < 0;
  const double ratio = aio_mbs > 0 && !failed ? cold_mbs / aio_mbs : -1;
  const double ratio_sync = fio_sync > 0 && !failed ? cold_mbs / fio_sync : -1;
  std::printf("medians of %d: disk tier cold read %.1f MB/s, fio libaio %.1f MB/s\n", a.reps,
              cold_mbs, aio_mbs);
  if (ratio > 0)
    std::printf("ratio: disk tier cold read / fio libaio = %.3f (target >= 0.8); / fio psync = %.3f\n",
                ratio, ratio_sync);

  nlohmann::json j = {{"bench", "disk_tier"},
                      {"blocks", a.blocks},
                      {"entry_bytes", entry},
                      {"write_threads", a.write_threads},
                      {"qd", a.qd},
                      {"reps", a.reps},
                      {"reads", a.buffered ? "buffered" : "O_DIRECT"},
                      {"write_mb_s", write_mbs},
                      {"write_cpu_ms_per_entry", write_cpu_ms},
                      {"page_cache", how},
                      {"resident_before_read", resident},
                      {"read_cold_mb_s", cold},
                      {"read_cold_median_mb_s", cold_mbs},
                      {"read_cpu_ms_per_entry", cpu_ms},
                      {"read_again_mb_s", warm_mbs},
                      {"fio_bs", bs},
                      {"fio_libaio_mb_s", fio_aio},
                      {"fio_libaio_median_mb_s", aio_mbs},
                      {"fio_psync_mb_s", fio_sync},
                      {"ratio_libaio", ratio},
                      {"ratio_psync", ratio_sync},
                      {"fio_found", have_fio}};
  std::printf("%s\n", j.dump().c_str());
  if (!a.json.empty()) std::ofstream(a.json, std::ios::app) << j.dump() << "\n";
  if (!a.keep) disk->EraseAll();
  if (!have_fio) return 3;
  return !failed && aio_mbs > 0 ? 0 : 1;
}
