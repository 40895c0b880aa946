// What the transfer benches share besides the peer protocol (tests/transport/gpu/gpu_peer.h):
// "--key=value" flags ("--key" alone = "1"), comma-separated lists, fatal errors that name
// the program, and the host CPU accounting of a measured span on both processes (the receiver
// answers the command "CPU" with its own process CPU time).
#pragma once

#include <cuda_runtime_api.h>
#include <errno.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/time.h"
#include "tests/transport/gpu/gpu_peer.h"

namespace kvstream::bench {

// Prints "<program>: <what>" on stderr and exits 1.
[[noreturn]] inline void Die(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, what.c_str());
  std::exit(1);
}

// A CUDA call that must succeed: otherwise Die() naming the call and the error.
#define KV_BENCH_CUDA(expr)                                                               \
  do {                                                                                    \
    const cudaError_t kv_bench_err_ = (expr);                                             \
    if (kv_bench_err_ != cudaSuccess)                                                     \
      ::kvstream::bench::Die(std::string(#expr) + ": " + cudaGetErrorString(kv_bench_err_)); \
  } while (0)

// Every "--key=value" of argv (later ones win); other arguments are ignored.
inline std::map<std::string, std::string> ParseArgs(int argc, char** argv) {
  std::map<std::string, std::string> out;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s.rfind("--", 0) != 0) continue;
    const size_t eq = s.find('=');
    if (eq == std::string::npos) out[s.substr(2)] = "1";
    else out[s.substr(2, eq - 2)] = s.substr(eq + 1);
  }
  return out;
}

// "a,b,,c" -> {"a", "b", "c"}.
inline std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) if (!item.empty()) out.push_back(item);
  return out;
}

// One JSON result line: on stdout (flushed) and, when open, appended to `json`.
inline void EmitJsonLine(const std::string& line, std::ofstream& json) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  if (json.is_open()) json << line << "\n" << std::flush;
}

// Median of `v` (0 when empty).
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Host-clocked median seconds of `iters` calls of `fn` (which must return only when its work is
// complete), after `warmups` calls that are not counted.
template <typename Fn>
double TimedMedian(int warmups, int iters, Fn fn) {
  for (int i = 0; i < warmups; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto start = Clock::now();
    fn();
    t.push_back(SecondsSince(start));
  }
  return Median(t);
}

// ---- host CPU cost -----------------------------------------------------------------------

// This process's CPU time (user + system, all threads: CLOCK_PROCESS_CPUTIME_ID) and the
// monotonic clock, both in ns, read together.
struct CpuClock {
  int64_t cpu_ns = 0;
  int64_t wall_ns = 0;
};
inline CpuClock ReadCpuClock() {
  timespec c{}, w{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c);
  clock_gettime(CLOCK_MONOTONIC, &w);
  return {int64_t(c.tv_sec) * 1000000000 + c.tv_nsec, int64_t(w.tv_sec) * 1000000000 + w.tv_nsec};
}

// Receiver: the answer to the command "CPU": "CPU <cpu_ns> <wall_ns>" ("" for any other line).
inline std::string CpuReply(const std::string& line) {
  if (line != "CPU") return "";
  const CpuClock c = ReadCpuClock();
  return "CPU " + std::to_string(c.cpu_ns) + " " + std::to_string(c.wall_ns);
}

// Writer: asks the receiver for its CpuClock; lines that are not the answer (a library printing
// on the receiver's stdout) are skipped. false when no answer came within 5 s.
inline bool AskPeerCpu(testing::PeerProcess& rx, CpuClock* out) {
  if (!rx.Send("CPU")) return false;
  const Deadline deadline = DeadlineAfterMs(5000);
  while (!Expired(deadline)) {
    const std::string line = rx.ReadLine(deadline);
    if (line.empty()) return false;
    std::istringstream in(line);
    std::string tag;
    long long cpu = 0, wall = 0;
    if (in >> tag >> cpu >> wall && tag == "CPU") {
      *out = {cpu, wall};
      return true;
    }
  }
  return false;
}

// CPU seconds both processes spent over one measured span. The writer's span is its own clock
// from just before the first measured call to just after the last; the receiver's is between
// its answers to "CPU" sent just before and just after that (so it encloses the writer's span
// plus a pipe round trip at each end). cores = CPU seconds / wall seconds of the same span: 1.0
// is one core busy the whole time. `writes` is the number of Write() calls inside the span.
struct CpuSpan {
  bool valid = false;
  int iters = 0;
  uint64_t writes = 0;
  double writer_cpu_s = 0, writer_wall_s = 0;
  double receiver_cpu_s = -1, receiver_wall_s = -1;  // -1: the receiver did not answer
  double writer_cores() const { return writer_wall_s > 0 ? writer_cpu_s / writer_wall_s : 0; }
  double receiver_cores() const {
    return receiver_wall_s > 0 ? receiver_cpu_s / receiver_wall_s : -1;
  }
  bool have_receiver() const { return receiver_wall_s > 0; }
};

// The start of a span: the receiver is asked first, then this process reads its own clock.
struct CpuMark {
  CpuClock self, peer;
  bool peer_ok = false;
};
inline CpuMark StartCpuSpan(testing::PeerProcess& rx) {
  CpuMark m;
  m.peer_ok = AskPeerCpu(rx, &m.peer);
  m.self = ReadCpuClock();
  return m;
}
// The end: this process's clock first, then the receiver's.
inline CpuSpan EndCpuSpan(const CpuMark& m, testing::PeerProcess& rx, int iters, uint64_t writes) {
  const CpuClock self = ReadCpuClock();
  CpuSpan s;
  s.valid = true;
  s.iters = iters;
  s.writes = writes;
  s.writer_cpu_s = (self.cpu_ns - m.self.cpu_ns) * 1e-9;
  s.writer_wall_s = (self.wall_ns - m.self.wall_ns) * 1e-9;
  CpuClock peer;
  if (m.peer_ok && AskPeerCpu(rx, &peer)) {
    s.receiver_cpu_s = (peer.cpu_ns - m.peer.cpu_ns) * 1e-9;
    s.receiver_wall_s = (peer.wall_ns - m.peer.wall_ns) * 1e-9;
  }
  return s;
}

// Host-clocked median seconds of calls of `fn` after `warmups` uncounted ones, like
// TimedMedian, where the measured calls are one CPU span of both processes (*cpu): at least
// `min_iters` calls, and more until the span has lasted `min_span_s` (the process CPU clock of
// threads running on other cores may only advance at scheduler ticks, 1-4 ms: a span of
// 200 ms keeps that below ~2% of a core per thread). Each call of fn makes `writes_per_call`
// Write() calls.
template <typename Fn>
double TimedMedianWithCpu(int warmups, int min_iters, double min_span_s, testing::PeerProcess& rx,
                          uint64_t writes_per_call, CpuSpan* cpu, Fn fn) {
  for (int i = 0; i < warmups; ++i) fn();
  const CpuMark mark = StartCpuSpan(rx);
  const auto span_start = Clock::now();
  std::vector<double> t;
  while (int(t.size()) < min_iters ||
         (SecondsSince(span_start) < min_span_s && t.size() < 1000000)) {
    const auto start = Clock::now();
    fn();
    t.push_back(SecondsSince(start));
  }
  *cpu = EndCpuSpan(mark, rx, int(t.size()), writes_per_call * t.size());
  return Median(t);
}

// A span of `ms` with an endpoint connected and no writes (this thread sleeps): what the
// transports' own threads cost while nothing moves.
inline CpuSpan IdleCpuSpan(testing::PeerProcess& rx, int ms) {
  const CpuMark mark = StartCpuSpan(rx);
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  return EndCpuSpan(mark, rx, 0, 0);
}

// The span lengths both transfer benches take: --idle-ms (the idle spans, IdleCpuSpan; 1-2000,
// default 200) and --cpu-ms (the shortest measured span, TimedMedianWithCpu; 0-5000, default
// 200). Values out of range are clamped.
struct CpuSpanFlags {
  int idle_ms = 200;
  int cpu_ms = 200;
};
inline CpuSpanFlags ParseCpuSpanFlags(const std::map<std::string, std::string>& args) {
  CpuSpanFlags f;
  if (args.count("idle-ms")) f.idle_ms = std::max(1, std::min(2000, std::stoi(args.at("idle-ms"))));
  if (args.count("cpu-ms")) f.cpu_ms = std::max(0, std::min(5000, std::stoi(args.at("cpu-ms"))));
  return f;
}

// The JSON fields of a span (appended to a row; "" when there is none): cpu_span_us (writer's
// wall span), cpu_iters, cpu_writes, writer_cpu_us, writer_cores, writer_cpu_us_per_write and
// writer_cpu_us_per_iter (when there were writes), and the receiver's receiver_span_us,
// receiver_cpu_us, receiver_cores, receiver_cpu_us_per_write, receiver_cpu_us_per_iter (when
// it answered).
inline std::string CpuJson(const CpuSpan& c) {
  if (!c.valid) return "";
  std::ostringstream j;
  j.setf(std::ios::fixed);
  j.precision(3);
  j << ",\"cpu_span_us\":" << c.writer_wall_s * 1e6 << ",\"cpu_iters\":" << c.iters
    << ",\"cpu_writes\":" << c.writes << ",\"writer_cpu_us\":" << c.writer_cpu_s * 1e6
    << ",\"writer_cores\":" << c.writer_cores();
  if (c.writes > 0) j << ",\"writer_cpu_us_per_write\":" << c.writer_cpu_s * 1e6 / c.writes;
  if (c.iters > 0) j << ",\"writer_cpu_us_per_iter\":" << c.writer_cpu_s * 1e6 / c.iters;
  if (c.have_receiver()) {
    j << ",\"receiver_span_us\":" << c.receiver_wall_s * 1e6
      << ",\"receiver_cpu_us\":" << c.receiver_cpu_s * 1e6
      << ",\"receiver_cores\":" << c.receiver_cores();
    if (c.writes > 0) j << ",\"receiver_cpu_us_per_write\":" << c.receiver_cpu_s * 1e6 / c.writes;
    if (c.iters > 0) j << ",\"receiver_cpu_us_per_iter\":" << c.receiver_cpu_s * 1e6 / c.iters;
  }
  return j.str();
}

// Table cells of a span: writer cores, receiver cores, writer and receiver CPU us per write
// (35 characters, "-" where not known).
inline std::string CpuCells(const CpuSpan& c) {
  char buf[96];
  auto cell = [](char* out, size_t n, int width, double v, bool known) {
    if (known) std::snprintf(out, n, " %*.2f", width, v);
    else std::snprintf(out, n, " %*s", width, "-");
  };
  char a[24], b[24], d[24], e[24];
  cell(a, sizeof(a), 6, c.writer_cores(), c.valid);
  cell(b, sizeof(b), 6, c.receiver_cores(), c.valid && c.have_receiver());
  cell(d, sizeof(d), 9, c.writes ? c.writer_cpu_s * 1e6 / c.writes : 0, c.valid && c.writes > 0);
  cell(e, sizeof(e), 9, c.writes ? c.receiver_cpu_s * 1e6 / c.writes : 0,
       c.valid && c.writes > 0 && c.have_receiver());
  std::snprintf(buf, sizeof(buf), "%s%s%s%s", a, b, d, e);
  return buf;
}
inline std::string CpuHeader() {
  char buf[96];
  std::snprintf(buf, sizeof(buf), " %6s %6s %9s %9s", "W core", "R core", "W cpu/wr", "R cpu/wr");
  return buf;
}

// The benches' receiver: counts notifications ("COUNT" answers "COUNT <n>") and answers "CPU"
// (CpuReply). Otherwise as testing::ServeAsReceiver.
inline int ServeAsBenchReceiver(Result<std::unique_ptr<transport::Transport>> made, int device,
                                int regions, uint64_t region_bytes, bool host_memory) {
  auto notes = std::make_shared<std::atomic<uint64_t>>(0);
  return testing::ServeAsReceiver(
      std::move(made), device, regions, region_bytes, host_memory,
      [notes](const testing::ReceiverPool&) -> transport::NotificationSink {
        return [notes](const transport::Notification&) { notes->fetch_add(1); };
      },
      [notes](const std::string& line, const testing::ReceiverPool&) {
        if (line == "COUNT") return "COUNT " + std::to_string(notes->load());
        return CpuReply(line);
      });
}

}  // namespace kvstream::bench
