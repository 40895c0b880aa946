// Test support for the GPU transport tests and benches: a peer process (this binary re-executed
// in a helper mode) spoken to over its stdin/stdout, the receiver side of that protocol (its
// pool, READY line and command loop), and the deterministic block plans and byte patterns both
// processes derive from (request id, layer) so that the receiver can check what landed without
// being told.
//
// Receiver protocol, stdout: "READY <hex address> <n> (<hex key> <addr> <length>)*" once its pool
// is registered (or "ERROR <why>"), then whatever its sink and commands print; stdin: one
// command per line until it closes, which is the writer's signal to clean up and exit
// ("ADMIT <hex ticket>", answered "ADMITTED OK", admits a writer's connection).
#pragma once

#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/cuda_vmm.h"
#include "common/status.h"
#include "common/time.h"
#include "tests/transport/test_util.h"
#include "transport/transport.h"

namespace kvstream::testing {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Content of destination block `dst_block` for write (request, layer): 64-bit words.
inline void FillPattern(uint64_t request, int layer, uint64_t dst_block, uint64_t* words,
                        size_t nwords) {
  const uint64_t seed = SplitMix64(request * 131 + static_cast<uint64_t>(layer)) ^ (dst_block << 24);
  for (size_t i = 0; i < nwords; ++i) words[i] = SplitMix64(seed + i);
}

// `count` distinct destination blocks out of `pool_blocks`, random but fixed by (request, layer),
// taken only among blocks of class `phase` out of `classes` (groups of 8 neighbouring blocks
// take turns: class(b) = (b / 8) % classes), so that writes of different classes never touch
// each other's blocks. Every fourth pick is followed by its neighbour when that is free and of
// the same class, so that some runs are contiguous on both sides.
inline uint64_t BlockClass(uint64_t b, uint64_t classes) { return (b / 8) % classes; }
inline std::vector<uint64_t> PlanBlocks(uint64_t request, int layer, uint64_t pool_blocks,
                                        size_t count, uint64_t classes = 1, uint64_t phase = 0) {
  std::mt19937_64 rng(SplitMix64(request ^ (static_cast<uint64_t>(layer) << 40)));
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < pool_blocks; ++i) {
    if (BlockClass(i, classes) == phase) ids.push_back(i);
  }
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<char> used(pool_blocks, 0);
  std::vector<uint64_t> out;
  for (size_t i = 0; i < ids.size() && out.size() < count; ++i) {
    uint64_t b = ids[i];
    if (used[b]) continue;
    used[b] = 1;
    out.push_back(b);
    const uint64_t next = b + 1;
    if (out.size() % 4 == 0 && next < pool_blocks && BlockClass(next, classes) == phase &&
        !used[next] && out.size() < count) {
      used[next] = 1;
      out.push_back(next);
    }
  }
  return out;
}

// A child process running this binary with extra arguments; its stdin and stdout are pipes.
class PeerProcess {
 public:
  PeerProcess() = default;
  ~PeerProcess() { Kill(); }
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  bool Start(const std::vector<std::string>& args) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return false;
    pid_ = fork();
    if (pid_ < 0) return false;
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      // stdout is the protocol: UCX's warnings go to stderr (its default is stdout).
      setenv("UCX_LOG_FILE", "stderr", 0);
      std::vector<char*> argv;
      static char self[] = "/proc/self/exe";
      argv.push_back(self);
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv("/proc/self/exe", argv.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_child_ = in[1];
    from_child_ = out[0];
    return true;
  }

  bool Send(const std::string& line) {
    std::string l = line + "\n";
    return write(to_child_, l.data(), l.size()) == static_cast<ssize_t>(l.size());
  }

  // Next line from the child's stdout; empty on EOF or deadline.
  std::string ReadLine(Deadline deadline) {
    for (;;) {
      size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return "";
      pollfd p{from_child_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char tmp[4096];
      ssize_t r = read(from_child_, tmp, sizeof(tmp));
      if (r <= 0) return "";
      buf_.append(tmp, static_cast<size_t>(r));
    }
  }

  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    CloseFds();
  }

  // Closes the child's stdin (its signal to exit) and reaps it; kills it after the deadline.
  int Finish(Deadline deadline) {
    if (to_child_ >= 0) {
      close(to_child_);
      to_child_ = -1;
    }
    int status = 0;
    while (pid_ > 0) {
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        break;
      }
      if (Expired(deadline)) {
        Kill();
        return -1;
      }
      usleep(10000);
    }
    CloseFds();
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  pid_t pid() const { return pid_; }

 private:
  void CloseFds() {
    if (to_child_ >= 0) close(to_child_);
    if (from_child_ >= 0) close(from_child_);
    to_child_ = from_child_ = -1;
  }
  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  std::string buf_;
};

// main(): true when CUDA sees a device (*count of them); otherwise prints
// "SKIP <binary>: no usable CUDA device (<why>)" and the caller exits 77 (CTest: skipped).
inline bool GpusUsable(const char* binary, int* count) {
  *count = 0;
  cudaError_t err = cudaGetDeviceCount(count);
  if (err != cudaSuccess || *count == 0) {
    std::printf("SKIP %s: no usable CUDA device (%s)\n", binary,
                err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount returned 0");
    return false;
  }
  return true;
}

using transport::test::FromHex;
using transport::test::ToHex;

// ---- receiver side of the peer protocol ---------------------------------------------------

// One line on stdout, flushed, under a lock shared by every thread of the process (the
// transport's notification thread prints too).
inline void PeerSay(const std::string& line) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// The receiver's pool: regions * region_bytes from one allocation, zeroed.
struct ReceiverPool {
  char* base = nullptr;
  int regions = 0;
  uint64_t region_bytes = 0;
  uint64_t bytes() const { return region_bytes * static_cast<uint64_t>(regions); }
};

// Runs the receiver process: `made` is its transport (an error is printed as ERROR, exit code
// 1); allocates the pool (on `device`, or in host memory when host_memory) and registers it as
// `regions` regions; installs make_sink(pool) as the notification sink; prints READY; answers
// each stdin line with on_command(line, pool) (nothing when that is empty); once stdin closes
// removes the sink, drops the registrations, destroys the transport (registrations may refer to
// it) and frees the pool. Returns the process's exit code.
inline int ServeAsReceiver(
    Result<std::unique_ptr<transport::Transport>> made, int device, int regions,
    uint64_t region_bytes, bool host_memory,
    const std::function<transport::NotificationSink(const ReceiverPool&)>& make_sink,
    const std::function<std::string(const std::string&, const ReceiverPool&)>& on_command) {
  if (!made.ok()) {
    PeerSay("ERROR " + made.status().ToString());
    return 1;
  }
  std::unique_ptr<transport::Transport> t = std::move(made).value();
  ReceiverPool pool{nullptr, regions, region_bytes};
  void* mem = nullptr;
  // Device pools are shareable memory, as the model's KV pools (cuda_ipc writes only into such).
  std::unique_ptr<cuda_vmm::ShareableDeviceMemory> dev_mem;
  if (host_memory) {
    mem = std::calloc(1, pool.bytes());
  } else if (auto m = cuda_vmm::ShareableDeviceMemory::Allocate(device, pool.bytes()); !m.ok()) {
    PeerSay("ERROR " + m.status().ToString());
    return 1;
  } else if (cudaMemset(m.value()->data(), 0, pool.bytes()) == cudaSuccess &&
             cudaDeviceSynchronize() == cudaSuccess) {
    dev_mem = std::move(m).value();
    mem = dev_mem->data();
  }
  if (mem == nullptr) {
    PeerSay("ERROR cannot allocate the receiver's pool of " + std::to_string(pool.bytes()) + " bytes");
    return 1;
  }
  pool.base = static_cast<char*>(mem);
  std::vector<std::unique_ptr<transport::Registration>> regs;
  int rc = 0;
  for (int r = 0; r < regions; ++r) {
    auto reg = t->Register({pool.base + r * region_bytes, region_bytes,
                            host_memory ? transport::MemoryKind::kHost : transport::MemoryKind::kCuda,
                            host_memory ? -1 : device});
    if (!reg.ok()) {
      PeerSay("ERROR " + reg.status().ToString());
      rc = 1;
      break;
    }
    regs.push_back(std::move(reg).value());
  }
  if (rc == 0) {
    t->SetNotificationSink(make_sink(pool));
    std::string ready = "READY " + ToHex(t->LocalAddress()) + " " + std::to_string(regions);
    for (auto& reg : regs) {
      ready += " " + ToHex(reg->RemoteKey()) + " " +
               std::to_string(reinterpret_cast<uint64_t>(reg->region().addr)) + " " +
               std::to_string(reg->region().length);
    }
    PeerSay(ready);
    std::string line;
    while (std::getline(std::cin, line)) {
      // "ADMIT <hex ticket>": a writer's connection (Transport::Admit), as a daemon's handshake.
      if (line.rfind("ADMIT ", 0) == 0) {
        Status s = t->Admit(FromHex(line.substr(6)));
        PeerSay(s.ok() ? std::string("ADMITTED OK") : "ADMITTED " + s.ToString());
        continue;
      }
      const std::string reply = on_command(line, pool);
      if (!reply.empty()) PeerSay(reply);
    }
    t->SetNotificationSink(nullptr);
  }
  regs.clear();
  t.reset();
  if (host_memory) std::free(mem);
  dev_mem.reset();
  return rc;
}

// The benches' receiver: counts notifications; the command "COUNT" answers "COUNT <n>".
inline int ServeAsCountingReceiver(Result<std::unique_ptr<transport::Transport>> made, int device,
                                   int regions, uint64_t region_bytes, bool host_memory) {
  auto notes = std::make_shared<std::atomic<uint64_t>>(0);
  return ServeAsReceiver(
      std::move(made), device, regions, region_bytes, host_memory,
      [notes](const ReceiverPool&) -> transport::NotificationSink {
        return [notes](const transport::Notification&) { notes->fetch_add(1); };
      },
      [notes](const std::string& line, const ReceiverPool&) {
        return line == "COUNT" ? "COUNT " + std::to_string(notes->load()) : std::string();
      });
}

// Writer side: the receiver's READY line as the peer to connect to. false unless `line` is a
// READY line announcing `regions` regions.
inline bool ParseReady(const std::string& line, int regions, transport::PeerDescriptor* peer) {
  std::istringstream in(line);
  std::string tag, addr;
  int n = 0;
  in >> tag >> addr >> n;
  if (tag != "READY" || n != regions) return false;
  peer->address = FromHex(addr);
  peer->regions.clear();
  for (int i = 0; i < n; ++i) {
    std::string key;
    transport::RemoteRegion rr;
    if (!(in >> key >> rr.addr >> rr.length)) return false;
    rr.key = FromHex(key);
    peer->regions.push_back(rr);
  }
  return true;
}

// Writer: a peer in this process: `rx`'s address and one region, the first `length` bytes of
// `remote` (one of rx's registrations).
inline transport::PeerDescriptor InProcessPeer(const transport::Transport& rx,
                                               const transport::Registration& remote, uint64_t length) {
  transport::PeerDescriptor peer;
  peer.address = rx.LocalAddress();
  peer.regions.push_back({reinterpret_cast<uint64_t>(remote.region().addr), length, remote.RemoteKey()});
  return peer;
}

// Writer: starts `proc` with `args` and waits up to timeout_ms for its READY line announcing
// `regions` regions. "" on success (*peer filled), else why not.
inline std::string StartPeerReceiver(PeerProcess* proc, const std::vector<std::string>& args,
                                     int regions, int64_t timeout_ms, transport::PeerDescriptor* peer) {
  if (!proc->Start(args)) return "fork/exec failed";
  const std::string line = proc->ReadLine(DeadlineAfterMs(timeout_ms));
  if (!ParseReady(line, regions, peer)) return "receiver did not start: '" + line + "'";
  return "";
}

// ---- the transport tests' checked writes -------------------------------------------------

// The receiver pool of the transport tests (one allocation, kPeerRegions regions of 64 KiB
// blocks: one KV block of a llama-3-8b layer). Writes to one region run back to back while the
// receiver checks earlier ones, so each layer owns a disjoint class of blocks
// (BlockClass(b, kPeerPhases) == PeerPhase(layer)) and never overwrites another layer's blocks:
// a check can only fail because of the write it checks.
inline constexpr uint64_t kPeerBlock = 64 * 1024;
inline constexpr uint64_t kPeerPoolBytes = 64ull << 20;
inline constexpr int kPeerRegions = 2;
inline constexpr uint64_t kPeerRegionBytes = kPeerPoolBytes / kPeerRegions;
inline constexpr uint64_t kPeerRegionBlocks = kPeerRegionBytes / kPeerBlock;
inline constexpr uint64_t kPeerPhases = 3;
inline constexpr int32_t kFlagCheckUntouched = 1;  // notification flag: also check the rest of the class is zero
inline uint64_t PeerPhase(int layer) {
  return static_cast<uint64_t>(layer / kPeerRegions) % kPeerPhases;
}
// request id of a checked write: its block count in the top 16 bits (the receiver needs it).
inline uint64_t RequestId(uint64_t serial, size_t count) { return (uint64_t(count) << 48) | serial; }

// Receiver: the sink that checks, when a notification arrives (on the transport's thread:
// blocking there is the test's choice), that every block of the announced write is already in
// the pool (and, with kFlagCheckUntouched, that the rest of the layer's class is still zero);
// prints "NOTE <request> <layer> OK" or "... BAD <why>".
inline transport::NotificationSink CheckingSink(const ReceiverPool& pool, int device) {
  auto host = std::make_shared<std::vector<uint64_t>>(kPeerRegionBytes / 8);
  char* base = pool.base;
  return [host, base, device](const transport::Notification& n) {
    const int region = n.layer % kPeerRegions;
    const size_t count = static_cast<size_t>(n.request_id >> 48);
    std::string verdict = "OK";
    cudaSetDevice(device);
    if (cudaMemcpy(host->data(), base + region * kPeerRegionBytes, kPeerRegionBytes,
                   cudaMemcpyDeviceToHost) != cudaSuccess) {
      verdict = "BAD cudaMemcpy";
    } else {
      std::vector<uint64_t> plan = PlanBlocks(n.request_id, n.layer, kPeerRegionBlocks, count,
                                              kPeerPhases, PeerPhase(n.layer));
      std::vector<char> touched(kPeerRegionBlocks, 0);
      std::vector<uint64_t> expect(kPeerBlock / 8);
      for (uint64_t b : plan) {
        touched[b] = 1;
        FillPattern(n.request_id, n.layer, b, expect.data(), expect.size());
        if (std::memcmp(expect.data(), host->data() + b * kPeerBlock / 8, kPeerBlock) != 0) {
          verdict = "BAD block " + std::to_string(b) + " differs";
          break;
        }
      }
      if (verdict == "OK" && (n.flags & kFlagCheckUntouched)) {
        for (uint64_t b = 0; b < kPeerRegionBlocks && verdict == "OK"; ++b) {
          if (touched[b] || BlockClass(b, kPeerPhases) != PeerPhase(n.layer)) continue;
          for (uint64_t w = 0; w < kPeerBlock / 8; ++w) {
            if ((*host)[b * kPeerBlock / 8 + w] != 0) {
              verdict = "BAD untouched block " + std::to_string(b) + " written";
              break;
            }
          }
        }
      }
    }
    PeerSay("NOTE " + std::to_string(n.request_id) + " " + std::to_string(n.layer) + " " + verdict);
  };
}

// Receiver command "HASH": a hash of the whole pool ("HASH <value>"), to see whether it changes.
inline std::string HashCommand(const std::string& line, const ReceiverPool& pool) {
  if (line != "HASH") return "";
  std::vector<uint64_t> all(pool.bytes() / 8);
  uint64_t h = 0;
  if (cudaMemcpy(all.data(), pool.base, pool.bytes(), cudaMemcpyDeviceToHost) == cudaSuccess) {
    for (uint64_t w : all) h = SplitMix64(h ^ w);
  }
  return "HASH " + std::to_string(h);
}

// Writer: the source of one checked write: block i holds the pattern of destination plan[i].
struct SourceWrite {
  std::vector<uint64_t> plan;
  std::vector<uint64_t> host;  // count * kPeerBlock bytes
  std::vector<transport::CopyOp> ops;
};
inline SourceWrite MakeSource(uint64_t request, int layer, size_t count) {
  SourceWrite w;
  w.plan = PlanBlocks(request, layer, kPeerRegionBlocks, count, kPeerPhases, PeerPhase(layer));
  w.host.resize(count * kPeerBlock / 8);
  for (size_t i = 0; i < w.plan.size(); ++i) {
    FillPattern(request, layer, w.plan[i], w.host.data() + i * kPeerBlock / 8, kPeerBlock / 8);
    w.ops.push_back({i * kPeerBlock, w.plan[i] * kPeerBlock, kPeerBlock});
  }
  return w;
}

// Writer: the request that lands `w` (staged at byte `local_offset` of `local`) in region
// `remote_region` of the receiver and then notifies `note`.
inline transport::WriteRequest CheckedWriteRequest(const transport::Registration* local,
                                                   const SourceWrite& w, uint64_t local_offset,
                                                   int remote_region, transport::Notification note) {
  transport::WriteRequest wr;
  wr.local = local;
  wr.remote_region = remote_region;
  for (transport::CopyOp op : w.ops) {
    op.local_offset += local_offset;
    wr.ops.push_back(op);
  }
  wr.notify = true;
  wr.notification = note;
  return wr;
}

// Writer: reads the receiver's NOTE lines until every (request, layer) of `want` arrived OK.
// "" on success, else why not (a BAD verdict, an unexpected notification, the deadline).
inline std::string ExpectNotesError(PeerProcess& proc, std::map<std::pair<uint64_t, int>, bool> want,
                                    int64_t timeout_ms) {
  auto deadline = DeadlineAfterMs(timeout_ms);
  while (!want.empty()) {
    std::string line = proc.ReadLine(deadline);
    if (line.empty()) return std::to_string(want.size()) + " notifications missing";
    std::istringstream in(line);
    std::string tag, verdict;
    unsigned long long req = 0;
    int layer = 0;
    in >> tag >> req >> layer >> verdict;
    if (tag != "NOTE") continue;
    if (verdict != "OK") return "receiver: " + line;
    if (want.erase({req, layer}) == 0) return "unexpected notification: " + line;
  }
  return "";
}

}  // namespace kvstream::testing
