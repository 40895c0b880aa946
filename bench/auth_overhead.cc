// auth_overhead: what the control plane's authentication costs a request, measured as TTFT
// through decode daemons that differ only in their credentials (plaintext, bearer tokens, mTLS;
// each decode talks to its own prefill with the same kind of credential). Requests run one at a
// time, round by round, each round visiting every mode in a rotated order, so the machine's drift
// hits every mode alike.
//
//   auth_overhead --mode NAME=HOST:PORT[,token=FILE][,ca=FILE,cert=FILE,key=FILE] ...
//                 [--runs 200] [--warmup 10] [--prompt-len 64] [--max-new-tokens 1]
//                 [--json-out FILE]
//
// The first --mode is the baseline. Printed per mode: TTFT p50 / p90 / mean, and p50 against the
// baseline's as a ratio with its 95% confidence interval (paired bootstrap over rounds, 2000
// resamples). Every mode must produce the same tokens (checked; exit 1 otherwise).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "connector/client_auth.h"
#include "daemon/credentials.h"
#include "proto/kvstream.grpc.pb.h"

namespace {

namespace v1 = kvstream::v1;
using kvstream::Result;
using Clock = std::chrono::steady_clock;

struct Mode {
  std::string name, address, token_file, ca, cert, key;
  std::unique_ptr<v1::Decode::Stub> stub;
  std::vector<double> ttft_s;  // by round
  std::vector<int32_t> tokens;
};

bool ParseMode(const std::string& spec, Mode* m, std::string* err) {
  const auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0) {
    *err = "--mode " + spec + ": want NAME=HOST:PORT[,key=value...]";
    return false;
  }
  m->name = spec.substr(0, eq);
  std::string rest = spec.substr(eq + 1);
  size_t start = 0;
  bool first = true;
  while (start <= rest.size()) {
    const size_t comma = rest.find(',', start);
    const std::string item = rest.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (first) {
      m->address = item;
      first = false;
    } else {
      const auto e = item.find('=');
      const std::string k = item.substr(0, e), v = e == std::string::npos ? "" : item.substr(e + 1);
      if (k == "token") m->token_file = v;
      else if (k == "ca") m->ca = v;
      else if (k == "cert") m->cert = v;
      else if (k == "key") m->key = v;
      else {
        *err = "--mode " + m->name + ": unknown key '" + k + "' (token, ca, cert, key)";
        return false;
      }
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (m->address.empty()) {
    *err = "--mode " + m->name + ": no address";
    return false;
  }
  return true;
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * double(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}

// One Generate; TTFT = call start to the first token. Returns false on a failed call.
bool Generate(Mode& m, const std::vector<int32_t>& prompt, int max_new, double* ttft_s,
              std::vector<int32_t>* tokens, std::string* err) {
  v1::GenerateRequest req;
  *req.mutable_prompt_tokens() = {prompt.begin(), prompt.end()};
  req.set_max_tokens(max_new);
  req.set_load_mode(v1::LOAD_MODE_PIPELINED);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  tokens->clear();
  const auto t0 = Clock::now();
  auto reader = m.stub->Generate(&ctx, req);
  v1::GenerateResponse r;
  bool first = true;
  while (reader->Read(&r)) {
    if (first) {
      *ttft_s = std::chrono::duration<double>(Clock::now() - t0).count();
      first = false;
    }
    tokens->push_back(r.token_id());
  }
  grpc::Status s = reader->Finish();
  if (!s.ok() || first) {
    *err = m.name + ": Generate failed: " + s.error_message();
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Mode> modes;
  int runs = 200, warmup = 10, prompt_len = 64, max_new = 1;
  std::string json_out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "auth_overhead: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--mode") {
      Mode m;
      std::string err;
      if (!ParseMode(value(), &m, &err)) {
        std::fprintf(stderr, "auth_overhead: %s\n", err.c_str());
        return 2;
      }
      modes.push_back(std::move(m));
    } else if (a == "--runs") runs = std::stoi(value());
    else if (a == "--warmup") warmup = std::stoi(value());
    else if (a == "--prompt-len") prompt_len = std::stoi(value());
    else if (a == "--max-new-tokens") max_new = std::stoi(value());
    else if (a == "--json-out") json_out = value();
    else {
      std::fprintf(stderr, "auth_overhead: unknown argument %s (see the file comment)\n", a.c_str());
      return 2;
    }
  }
  if (modes.empty() || runs < 1 || prompt_len < 1 || max_new < 1) {
    std::fprintf(stderr, "auth_overhead: give at least one --mode, --runs/--prompt-len/--max-new-tokens >= 1\n");
    return 2;
  }
  for (Mode& m : modes) {
    kvstream::connector::ClientAuth auth;
    if (!m.ca.empty()) {
      auto creds = kvstream::daemon::ClientChannelCredentials(m.ca, m.cert, m.key, 3600);
      if (!creds.ok()) {
        std::fprintf(stderr, "auth_overhead: %s: %s\n", m.name.c_str(), creds.status().ToString().c_str());
        return 2;
      }
      auth.credentials = *creds;
    }
    if (!m.token_file.empty()) {
      auto token = kvstream::daemon::ReadTokenFile("token", m.token_file);
      if (!token.ok()) {
        std::fprintf(stderr, "auth_overhead: %s: %s\n", m.name.c_str(), token.status().ToString().c_str());
        return 2;
      }
      auth.bearer_token = *token;
    }
    m.stub = v1::Decode::NewStub(kvstream::connector::CreateAuthChannel(m.address, auth));
  }
  std::vector<int32_t> prompt(prompt_len);
  for (int i = 0; i < prompt_len; ++i) prompt[i] = 1 + (i * 7) % 200;

  const size_t n = modes.size();
  std::string err;
  double t = 0;
  std::vector<int32_t> tokens;
  for (int w = 0; w < warmup; ++w)
    for (Mode& m : modes)
      if (!Generate(m, prompt, max_new, &t, &tokens, &err)) {
        std::fprintf(stderr, "auth_overhead: warm-up: %s\n", err.c_str());
        return 1;
      }
  for (int r = 0; r < runs; ++r) {
    for (size_t k = 0; k < n; ++k) {
      Mode& m = modes[(size_t(r) + k) % n];
      if (!Generate(m, prompt, max_new, &t, &tokens, &err)) {
        std::fprintf(stderr, "auth_overhead: round %d: %s\n", r, err.c_str());
        return 1;
      }
      if (m.tokens.empty()) m.tokens = tokens;
      m.ttft_s.push_back(t);
    }
  }
  bool same = true;
  for (Mode& m : modes) same = same && m.tokens == modes[0].tokens;

  // Paired bootstrap over rounds: the ratio of each mode's p50 to the baseline's.
  std::mt19937_64 rng(12345);
  std::uniform_int_distribution<int> pick(0, runs - 1);
  constexpr int kResamples = 2000;
  std::vector<std::vector<double>> ratios(n);
  std::vector<double> a(runs), b(runs);
  for (int s = 0; s < kResamples; ++s) {
    std::vector<int> idx(runs);
    for (int& i : idx) i = pick(rng);
    for (int i = 0; i < runs; ++i) a[i] = modes[0].ttft_s[idx[i]];
    const double base = Quantile(a, 0.5);
    for (size_t k = 1; k < n; ++k) {
      for (int i = 0; i < runs; ++i) b[i] = modes[k].ttft_s[idx[i]];
      ratios[k].push_back(Quantile(b, 0.5) / base);
    }
  }

  std::ofstream json;
  if (!json_out.empty()) json.open(json_out, std::ios::app);
  const double base_p50 = Quantile(modes[0].ttft_s, 0.5);
  std::printf("auth_overhead: %d rounds x %zu modes, prompt %d tokens, %d new, TTFT in ms\n", runs, n,
              prompt_len, max_new);
  std::printf("%-10s %9s %9s %9s %22s\n", "mode", "p50", "p90", "mean", "p50 vs first [95% CI]");
  for (size_t k = 0; k < n; ++k) {
    const Mode& m = modes[k];
    double mean = 0;
    for (double x : m.ttft_s) mean += x;
    mean /= double(m.ttft_s.size());
    const double p50 = Quantile(m.ttft_s, 0.5), p90 = Quantile(m.ttft_s, 0.9);
    const double ratio = p50 / base_p50;
    const double lo = k ? Quantile(ratios[k], 0.025) : 1, hi = k ? Quantile(ratios[k], 0.975) : 1;
    std::printf("%-10s %9.3f %9.3f %9.3f %8.4f [%6.4f, %6.4f]\n", m.name.c_str(), p50 * 1e3, p90 * 1e3,
                mean * 1e3, ratio, lo, hi);
    if (json.is_open()) {
      nlohmann::ordered_json j;
      j["bench"] = "auth_overhead";
      j["mode"] = m.name;
      j["runs"] = runs;
      j["prompt_len"] = prompt_len;
      j["max_new_tokens"] = max_new;
      j["ttft_p50_ms"] = p50 * 1e3;
      j["ttft_p90_ms"] = p90 * 1e3;
      j["ttft_mean_ms"] = mean * 1e3;
      j["p50_ratio_vs_" + modes[0].name] = ratio;
      j["ratio_ci95"] = {lo, hi};
      j["same_tokens"] = m.tokens == modes[0].tokens;
      json << j.dump() << "\n";
    }
  }
  if (!same) {
    std::fprintf(stderr, "auth_overhead: the modes produced different tokens\n");
    return 1;
  }
  return 0;
}
