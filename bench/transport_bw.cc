// transport_bw: kvstream UCX Write bandwidth between two processes on this host, measured side
// by side with `ucx_perftest -t ucp_put_bw` (same UCX_TLS, same message size, same iteration
// count, same run), alternating them for every repetition. ucx_perftest runs twice: as is, and
// with -e (endpoints with error handling, UCP_ERR_HANDLING_MODE_PEER, as kvstream's are; in
// UCX 1.13 that mode leaves out the transports without peer-failure support, e.g. shared
// memory and TCP's RMA lanes, so it is the same-transport baseline).
//
//   transport_bw [--tls tcp] [--net-devices lo] [--sizes 64K,256K,1M,4M,16M,64M]
//                [--window 8] [--reps 3] [--seconds 0.5] [--memory allocate|register]
//                [--no-notify] [--perftest ucx_perftest] [--port 13500]
//
// Each kvstream write is one message of <size> bytes (one CopyOp) put into the peer's region
// followed by a flush and, unless --no-notify, the layer notification, exactly as the prefill
// daemon writes a layer; --window writes are kept in flight. ucx_perftest's put_bw posts its
// puts back to back and flushes once at the end. Bandwidth in MiB/s (ucx_perftest's "MB/s").
// Output: one JSON line per measurement and per size summary, then a table.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/time.h"
#include "transport/transport.h"

using namespace kvstream;
using namespace kvstream::transport;

namespace {

struct Args {
  std::string tls = "tcp";
  std::string net_devices;
  std::vector<size_t> sizes = {64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20};
  int window = 8;
  int reps = 3;
  double seconds = 0.5;
  bool allocate = true;
  bool notify = true;
  std::string perftest = "ucx_perftest";
  int port = 13500;
  bool serve = false;  // internal: the receiving process
  size_t serve_bytes = 0;
};

size_t ParseSize(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  switch (end && *end ? *end : ' ') {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1 << 20; break;
    case 'G': case 'g': v *= 1 << 30; break;
    default: break;
  }
  return static_cast<size_t>(v);
}

std::string Hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string o;
  for (unsigned char c : s) {
    o.push_back(d[c >> 4]);
    o.push_back(d[c & 15]);
  }
  return o;
}
std::string Unhex(const std::string& h) {
  auto v = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  std::string o;
  for (size_t i = 0; i + 1 < h.size(); i += 2) o.push_back(static_cast<char>(v(h[i]) * 16 + v(h[i + 1])));
  return o;
}

// A child process with piped stdin/stdout, killed with its parent.
struct Child {
  pid_t pid = -1;
  int in = -1, out = -1;
  std::string buf;

  bool Start(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
    int a[2], b[2];
    if (pipe2(a, O_CLOEXEC) || pipe2(b, O_CLOEXEC)) return false;
    pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      dup2(a[0], 0);
      dup2(b[1], 1);
      dup2(b[1], 2);
      for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
      std::vector<char*> args;
      for (const auto& s : argv) args.push_back(const_cast<char*>(s.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
    close(a[0]);
    close(b[1]);
    in = a[1];
    out = b[0];
    return true;
  }
  bool ReadLine(std::string* line, Deadline deadline) {
    for (;;) {
      size_t nl = buf.find('\n');
      if (nl != std::string::npos) {
        *line = buf.substr(0, nl);
        buf.erase(0, nl + 1);
        return true;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      pollfd p{out, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0))) <= 0) {
        if (Expired(deadline)) return false;
        continue;
      }
      char tmp[4096];
      ssize_t n = read(out, tmp, sizeof(tmp));
      if (n <= 0) {
        if (!buf.empty()) {
          *line = buf;
          buf.clear();
          return true;
        }
        return false;
      }
      buf.append(tmp, static_cast<size_t>(n));
    }
  }
  void Finish(Deadline deadline) {
    if (in >= 0) close(in);
    in = -1;
    while (pid > 0 && !Expired(deadline)) {
      if (waitpid(pid, nullptr, WNOHANG) == pid) {
        pid = -1;
        break;
      }
      usleep(2000);
    }
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      pid = -1;
    }
    if (out >= 0) close(out);
    out = -1;
  }
  ~Child() { Finish(Clock::now()); }
};

// True once something listens on TCP `port` (IPv4 or IPv6), per /proc/net/tcp{,6}.
bool WaitListening(int port, Deadline deadline) {
  char want[16];
  std::snprintf(want, sizeof(want), ":%04X", port);
  while (!Expired(deadline)) {
    for (const char* f : {"/proc/net/tcp", "/proc/net/tcp6"}) {
      FILE* fp = std::fopen(f, "r");
      if (fp == nullptr) continue;
      char l[512];
      bool found = false;
      while (std::fgets(l, sizeof(l), fp)) {
        std::istringstream in(l);
        std::string sl, local, remote, st;
        in >> sl >> local >> remote >> st;
        if (st == "0A" && local.size() >= 5 && local.compare(local.size() - 5, 5, want) == 0) found = true;
      }
      std::fclose(fp);
      if (found) return true;
    }
    usleep(5000);
  }
  return false;
}

std::vector<std::string> UcxEnv(const Args& a) {
  std::vector<std::string> env;
  if (!a.tls.empty()) env.push_back("UCX_TLS=" + a.tls);
  if (!a.net_devices.empty()) env.push_back("UCX_NET_DEVICES=" + a.net_devices);
  return env;
}

TransportOptions Options(const Args& a) {
  TransportOptions o;
  o.backend = "ucx";
  o.ucx.tls = a.tls;
  o.ucx.net_devices = a.net_devices;
  o.ucx.admit_any = true;  // a benchmark: the receiver takes the writer's connection unasked
  return o;
}

Result<std::unique_ptr<Registration>> Region(Transport& t, const Args& a, size_t bytes,
                                             std::vector<uint8_t>* backing) {
  if (a.allocate) return t.Allocate(bytes);
  backing->assign(bytes, 1);
  return t.Register(MemoryRegion{backing->data(), bytes});
}

// The receiving process: a region of --serve bytes; prints READY, counts notifications, exits
// when stdin closes.
int Serve(const Args& a) {
  auto t = CreateTransport(Options(a));
  if (!t.ok()) {
    std::printf("ERROR %s\n", t.status().ToString().c_str());
    return 1;
  }
  std::vector<uint8_t> backing;
  auto reg = Region(**t, a, a.serve_bytes, &backing);
  if (!reg.ok()) {
    std::printf("ERROR %s\n", reg.status().ToString().c_str());
    return 1;
  }
  std::atomic<uint64_t> notes{0};
  (*t)->SetNotificationSink([&](const Notification&) { notes.fetch_add(1); });
  std::printf("READY %s %llu %zu %s\n", Hex((*t)->LocalAddress()).c_str(),
              static_cast<unsigned long long>(reinterpret_cast<uintptr_t>((*reg)->region().addr)),
              (*reg)->region().length, Hex((*reg)->RemoteKey()).c_str());
  std::fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  (*t)->SetNotificationSink(nullptr);
  return 0;
}

// Posts `count` writes of `size` bytes keeping `window` in flight; MiB/s, or <0 on error.
double RunKvstream(Endpoint& ep, const Registration& local, size_t size, int count, int window,
                   bool notify, std::string* error) {
  std::deque<std::unique_ptr<WriteHandle>> inflight;
  WriteRequest r;
  r.local = &local;
  r.ops = {CopyOp{0, 0, size}};
  r.notify = notify;
  auto t0 = Clock::now();
  for (int i = 0; i < count || !inflight.empty();) {
    if (i < count && static_cast<int>(inflight.size()) < window) {
      r.notification = Notification{static_cast<uint64_t>(i), 0, 0};
      auto h = ep.Write(r);
      if (!h.ok()) {
        *error = h.status().ToString();
        return -1;
      }
      inflight.push_back(std::move(h).value());
      ++i;
      continue;
    }
    Status s = inflight.front()->Wait(DeadlineAfterMs(60000));
    if (!s.ok()) {
      *error = s.ToString();
      return -1;
    }
    inflight.pop_front();
  }
  double secs = SecondsSince(t0);
  return static_cast<double>(size) * count / secs / (1 << 20);
}

// One ucx_perftest server + client pair on loopback; MiB/s ("overall" bandwidth), <0 on error.
double RunPerftestOnce(const Args& a, size_t size, int count, int warmup, int port,
                       bool error_handling, std::string* error);

// ucx_perftest's own TCP bootstrap sometimes fails on a loaded sandbox; a failed run is
// retried on a fresh port (twice) before the benchmark gives up.
double RunPerftest(const Args& a, size_t size, int count, int warmup, int* port,
                   bool error_handling, std::string* error) {
  double r = -1;
  for (int attempt = 0; attempt < 3 && r < 0; ++attempt) {
    r = RunPerftestOnce(a, size, count, warmup, (*port)++, error_handling, error);
    if (r < 0) std::fprintf(stderr, "ucx_perftest attempt %d failed: %s\n", attempt + 1, error->c_str());
  }
  return r;
}

double RunPerftestOnce(const Args& a, size_t size, int count, int warmup, int port,
                       bool error_handling, std::string* error) {
  Child server, client;
  auto env = UcxEnv(a);
  std::vector<std::string> sargv = {a.perftest, "-p", std::to_string(port)};
  if (error_handling) sargv.push_back("-e");
  if (!server.Start(sargv, env)) {
    *error = "cannot start " + a.perftest;
    return -1;
  }
  // The server's stdout is block-buffered; watch for its listening socket instead.
  if (!WaitListening(port, DeadlineAfterMs(10000))) {
    *error = "ucx_perftest server is not listening on port " + std::to_string(port);
    return -1;
  }
  std::string line;
  std::vector<std::string> cargv = {a.perftest, "127.0.0.1", "-p", std::to_string(port),
                                    "-t", "ucp_put_bw", "-s", std::to_string(size),
                                    "-n", std::to_string(count), "-w", std::to_string(warmup), "-v"};
  if (error_handling) cargv.push_back("-e");
  client.Start(cargv, env);
  std::string last, all;
  while (client.ReadLine(&line, DeadlineAfterMs(120000))) {
    all += line + "\n";
    size_t first = line.find_first_not_of(' ');
    if (first != std::string::npos && std::isdigit(static_cast<unsigned char>(line[first])) &&
        line.find(',') != std::string::npos) {
      last = line;  // the final line; per-second ones start with "[thread N]"
    }
  }
  client.Finish(DeadlineAfterMs(5000));
  server.Finish(DeadlineAfterMs(5000));
  // iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr
  std::vector<std::string> f;
  std::stringstream ss(last);
  for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
  if (f.size() < 8 || std::atoi(f[0].c_str()) != count) {
    *error = "cannot parse ucx_perftest output:\n" + all;
    return -1;
  }
  return std::atof(f[5].c_str());
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string SizeName(size_t s) {
  if (s >= (1 << 20) && s % (1 << 20) == 0) return std::to_string(s >> 20) + "M";
  if (s >= 1024 && s % 1024 == 0) return std::to_string(s >> 10) + "K";
  return std::to_string(s);
}

int Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--tls T] [--net-devices D] [--sizes 64K,1M,...] [--window N]\n"
               "          [--reps N] [--seconds S] [--memory allocate|register] [--no-notify]\n"
               "          [--perftest PATH] [--port P]\n",
               argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (k == "--tls") a.tls = val();
    else if (k == "--net-devices") a.net_devices = val();
    else if (k == "--sizes") {
      a.sizes.clear();
      std::stringstream ss(val());
      for (std::string x; std::getline(ss, x, ',');) a.sizes.push_back(ParseSize(x));
    } else if (k == "--window") a.window = std::atoi(val().c_str());
    else if (k == "--reps") a.reps = std::atoi(val().c_str());
    else if (k == "--seconds") a.seconds = std::atof(val().c_str());
    else if (k == "--memory") a.allocate = val() != "register";
    else if (k == "--no-notify") a.notify = false;
    else if (k == "--perftest") a.perftest = val();
    else if (k == "--port") a.port = std::atoi(val().c_str());
    else if (k == "--serve") {
      a.serve = true;
      a.serve_bytes = ParseSize(val());
    } else return Usage(argv[0]);
  }
  if (a.tls == "-") a.tls.clear();
  if (a.serve) return Serve(a);
  if (a.sizes.empty() || a.window < 1 || a.reps < 1) return Usage(argv[0]);

  size_t max_size = *std::max_element(a.sizes.begin(), a.sizes.end());
  std::vector<std::string> peer_argv = {"/proc/self/exe", "--serve", std::to_string(max_size),
                                        "--tls", a.tls.empty() ? "-" : a.tls,
                                        "--memory", a.allocate ? "allocate" : "register"};
  if (!a.net_devices.empty()) {
    peer_argv.push_back("--net-devices");
    peer_argv.push_back(a.net_devices);
  }
  Child peer;
  std::string line;
  // The receiver's log lines share the pipe with its READY line: skip them (up to an ERROR).
  bool ready = peer.Start(peer_argv, {});
  auto ready_deadline = DeadlineAfterMs(20000);
  std::string peer_log;
  while (ready && (ready = peer.ReadLine(&line, ready_deadline))) {
    if (line.rfind("READY ", 0) == 0) break;
    peer_log += line + "\n";
    if (line.rfind("ERROR ", 0) == 0) ready = false;
  }
  if (!ready) {
    std::fprintf(stderr, "receiver did not start:\n%s\n", peer_log.c_str());
    return 1;
  }
  std::stringstream ps(line);
  std::string tag, addr, key;
  uint64_t base = 0, len = 0;
  ps >> tag >> addr >> base >> len >> key;

  auto t = CreateTransport(Options(a));
  if (!t.ok()) {
    std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
    return 1;
  }
  std::vector<uint8_t> backing;
  auto src = Region(**t, a, max_size, &backing);
  if (!src.ok()) {
    std::fprintf(stderr, "%s\n", src.status().ToString().c_str());
    return 1;
  }
  std::memset((*src)->region().addr, 7, max_size);
  PeerDescriptor pd{Unhex(addr), {RemoteRegion{base, len, Unhex(key)}}, ""};
  auto ep = (*t)->Connect(pd);
  if (!ep.ok()) {
    std::fprintf(stderr, "%s\n", ep.status().ToString().c_str());
    return 1;
  }

  struct Row {
    size_t size;
    int iters;
    double ours, theirs, theirs_e;
  };
  std::vector<Row> rows;
  int port = a.port;
  for (size_t size : a.sizes) {
    std::string err;
    // Calibrate the iteration count on our side so one measurement takes about --seconds,
    // after a warm-up (the first writes to a peer include connection set-up).
    double probe = RunKvstream(**ep, **src, size, 8, a.window, a.notify, &err);
    if (probe >= 0) probe = RunKvstream(**ep, **src, size, 64, a.window, a.notify, &err);
    if (probe < 0) {
      std::fprintf(stderr, "kvstream write failed: %s\n", err.c_str());
      return 1;
    }
    int iters = std::clamp(static_cast<int>(a.seconds * probe * (1 << 20) / size), 16, 200000);
    int warmup = std::max(4, iters / 10);
    std::vector<double> ours, theirs, theirs_e;
    for (int rep = 0; rep < a.reps; ++rep) {
      if (RunKvstream(**ep, **src, size, warmup, a.window, a.notify, &err) < 0) {
        std::fprintf(stderr, "kvstream warmup failed: %s\n", err.c_str());
        return 1;
      }
      double k = RunKvstream(**ep, **src, size, iters, a.window, a.notify, &err);
      if (k < 0) {
        std::fprintf(stderr, "kvstream write failed: %s\n", err.c_str());
        return 1;
      }
      double p = RunPerftest(a, size, iters, warmup, &port, /*error_handling=*/false, &err);
      if (p < 0) {
        std::fprintf(stderr, "ucx_perftest failed: %s\n", err.c_str());
        return 1;
      }
      double pe = RunPerftest(a, size, iters, warmup, &port, /*error_handling=*/true, &err);
      if (pe < 0) {
        std::fprintf(stderr, "ucx_perftest -e failed: %s\n", err.c_str());
        return 1;
      }
      ours.push_back(k);
      theirs.push_back(p);
      theirs_e.push_back(pe);
      std::printf("{\"bench\":\"transport_bw\",\"tls\":\"%s\",\"size\":%zu,\"iters\":%d,"
                  "\"window\":%d,\"notify\":%s,\"memory\":\"%s\",\"rep\":%d,"
                  "\"kvstream_MiBps\":%.1f,\"perftest_MiBps\":%.1f,\"perftest_e_MiBps\":%.1f,"
                  "\"ratio\":%.3f,\"ratio_e\":%.3f}\n",
                  a.tls.c_str(), size, iters, a.window, a.notify ? "true" : "false",
                  a.allocate ? "allocate" : "register", rep, k, p, pe, k / p, k / pe);
      std::fflush(stdout);
    }
    Row row{size, iters, Median(ours), Median(theirs), Median(theirs_e)};
    std::printf("{\"bench\":\"transport_bw\",\"summary\":true,\"tls\":\"%s\",\"size\":%zu,"
                "\"kvstream_MiBps\":%.1f,\"perftest_MiBps\":%.1f,\"perftest_e_MiBps\":%.1f,"
                "\"ratio\":%.3f,\"ratio_e\":%.3f}\n",
                a.tls.c_str(), size, row.ours, row.theirs, row.theirs_e, row.ours / row.theirs,
                row.ours / row.theirs_e);
    std::fflush(stdout);
    rows.push_back(row);
  }
  std::printf("\nUCX_TLS=%s  window=%d  notify=%s  memory=%s  (median of %d reps, MiB/s)\n",
              a.tls.empty() ? "(default)" : a.tls.c_str(), a.window, a.notify ? "on" : "off",
              a.allocate ? "allocate" : "register", a.reps);
  std::printf("%8s %8s %10s %13s %8s %16s %8s\n", "size", "iters", "kvstream", "perftest", "ratio",
              "perftest -e", "ratio");
  for (const Row& r : rows) {
    std::printf("%8s %8d %10.1f %13.1f %7.1f%% %16.1f %7.1f%%\n", SizeName(r.size).c_str(), r.iters,
                r.ours, r.theirs, 100 * r.ours / r.theirs, r.theirs_e, 100 * r.ours / r.theirs_e);
  }
  std::printf("perftest = ucx_perftest -t ucp_put_bw; perftest -e = the same with endpoint error\n"
              "handling (UCP_ERR_HANDLING_MODE_PEER), which kvstream always uses.\n");
  ep->reset();
  peer.Finish(DeadlineAfterMs(5000));
  return 0;
}
