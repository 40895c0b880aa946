#include "tests/daemons/disagg_fixture.h"

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace kvstream::testing {

namespace {
// The binaries CMake built, unless the environment names others (a copy of the binaries run on
// another machine, e.g. the GPU machine, where the build tree's paths do not exist).
std::string DaemonBin(const char* env, const char* built) {
  const char* v = std::getenv(env);
  return v && *v ? v : built;
}
}  // namespace

std::string PrefillBin() { return DaemonBin("KVSTREAM_PREFILL_BIN", KVSTREAM_PREFILL_BIN); }
std::string DecodeBin() { return DaemonBin("KVSTREAM_DECODE_BIN", KVSTREAM_DECODE_BIN); }

std::string RunCapture(const std::string& cmd, int* rc, bool with_stderr) {
  std::string out;
  FILE* p = popen((cmd + (with_stderr ? " 2>&1" : " 2>/dev/null")).c_str(), "r");
  if (!p) {
    *rc = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

std::string SmallTokenizerJson(const std::string& tokenizer_data) {
  std::ifstream in(tokenizer_data + "/llama3/tokenizer.json");
  std::stringstream ss;
  ss << in.rdbuf();
  auto j = nlohmann::json::parse(ss.str());
  nlohmann::json vocab = nlohmann::json::object();
  for (auto it = j["model"]["vocab"].begin(); it != j["model"]["vocab"].end(); ++it) {
    if (it->get<int>() < 500) vocab[it.key()] = *it;
  }
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& m : j["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    const std::string merged = s.substr(0, s.find(' ')) + s.substr(s.find(' ') + 1);
    if (vocab.contains(merged)) merges.push_back(m);
  }
  j["model"]["vocab"] = vocab;
  j["model"]["merges"] = merges;
  j["added_tokens"] = nlohmann::json::array({{{"id", 500}, {"content", "<|begin_of_text|>"}, {"special", true},
                                              {"normalized", false}, {"lstrip", false}, {"rstrip", false},
                                              {"single_word", false}}});
  for (int id = 501; id < 512; ++id) {  // the rest of the model's vocabulary: special tokens
    j["added_tokens"].push_back({{"id", id}, {"content", "<|reserved_" + std::to_string(id) + "|>"},
                                 {"special", true}, {"normalized", false}, {"lstrip", false},
                                 {"rstrip", false}, {"single_word", false}});
  }
  j["post_processor"]["processors"][1]["special_tokens"]["<|begin_of_text|>"]["ids"] = {500};
  return j.dump();
}

// The openssl CLI: a CA (ca-<ca>.pem/.key) and certificates signed by it whose CN and DNS SAN
// are `name` (plus localhost and IP 127.0.0.1, the address the tests dial).
void MakeCa(const std::string& dir, const std::string& ca) {
  int rc = 0;
  std::string out = RunCapture(
      "cd " + dir + " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes " +
          "-days 1 -subj /CN=" + ca + " -keyout " + ca + ".key -out " + ca + ".pem",
      &rc, true);
  ASSERT_EQ(rc, 0) << out;
}
void MakeCert(const std::string& dir, const std::string& ca, const std::string& name,
              const std::string& file) {
  int rc = 0;
  std::string out = RunCapture(
      "cd " + dir + " && openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=" +
          name + " -keyout " + file + ".key.new -out " + file + ".csr && printf " +
          "'subjectAltName=DNS:" + name + ",DNS:localhost,IP:127.0.0.1\\n' > " + file + ".ext && " +
          "openssl x509 -req -in " + file + ".csr -CA " + ca + ".pem -CAkey " + ca + ".key " +
          "-CAcreateserial -days 1 -extfile " + file + ".ext -out " + file + ".pem.new && " +
          // Replaced by rename, so a reader sees the old file or the new one, never a part.
          "chmod 600 " + file + ".key.new && mv " + file + ".key.new " + file + ".key && mv " +
          file + ".pem.new " + file + ".pem",
      &rc, true);
  ASSERT_EQ(rc, 0) << out;
}

std::vector<std::string> DefaultDaemonFlags() {
  const char* tls = std::getenv("KVSTREAM_TEST_UCX_TLS");
  std::vector<std::string> flags = {"--ucx_tls=" + std::string(tls ? tls : "tcp"), "--threads=1",
                                    "--quarantine_ms=300", "--cancel_timeout_ms=2000",
                                    // nothing routes around a test's daemons: no drain delay
                                    "--drain_delay_ms=0"};
  // Pinned to loopback: unpinned, UCX puts every interface of the host into the address, and
  // its TCP lanes may run over one that another test made (daemons_netns_test's veth, also
  // from another checkout's ctest on the same host). When that test deletes it, the segments
  // in flight are black-holed and TCP retransmits with backoff: the KV load hangs until its
  // deadline with no error anywhere.
  const char* devices = std::getenv("KVSTREAM_TEST_UCX_NET_DEVICES");
  const std::string dev = devices ? devices : "lo";
  if (!dev.empty()) flags.push_back("--ucx_net_devices=" + dev);
  return flags;
}

void DisaggTest::TearDown() {
  if (HasFailure()) {
    if (prefill_) std::fprintf(stderr, "---- prefill log ----\n%s\n", prefill_->Log().c_str());
    if (decode_) std::fprintf(stderr, "---- decode log ----\n%s\n", decode_->Log().c_str());
  }
  if (decode_) decode_->Signal(SIGKILL);
  if (prefill_) prefill_->Signal(SIGKILL);
}

std::string DisaggTest::prefill_address() const {
  return pair_.prefill_host + ":" + std::to_string(prefill_->port());
}

void DisaggTest::StartPrefill() {
  std::vector<std::string> args = DefaultDaemonFlags();
  for (auto& a : pair_.common) args.push_back(a);
  for (auto& a : pair_.prefill) args.push_back(a);
  std::string host = pair_.prefill_prefix.empty() ? "127.0.0.1" : pair_.prefill_host;
  args.push_back("--listen=" + host + ":" + std::to_string(pair_.prefill_port));
  prefill_ = std::make_unique<DaemonProcess>("prefill", PrefillBin(), args, dir_.path(),
                                             pair_.prefill_prefix);
  Status s = prefill_->Start(DeadlineAfterMs(300000));
  ASSERT_TRUE(s.ok()) << s.ToString();
}

void DisaggTest::StartDecode() {
  std::vector<std::string> args = DefaultDaemonFlags();
  for (auto& a : pair_.common) args.push_back(a);
  for (auto& a : pair_.decode) args.push_back(a);
  args.push_back("--listen=" + pair_.decode_listen);
  args.push_back("--peer=" + prefill_address());
  decode_ = std::make_unique<DaemonProcess>("decode", DecodeBin(), args, dir_.path(),
                                            pair_.decode_prefix);
  Status s = decode_->Start(DeadlineAfterMs(300000));
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::string host = pair_.decode_listen.substr(0, pair_.decode_listen.rfind(':'));
  stub_ = DecodeStub(host + ":" + std::to_string(decode_->port()));
}

void DisaggTest::StartDaemonsTogether(const DaemonPair& pair) {
  pair_ = pair;
  if (pair_.prefill_port == 0) pair_.prefill_port = PickFreePort();
  std::vector<std::string> pargs = DefaultDaemonFlags();
  for (auto& a : pair_.common) pargs.push_back(a);
  for (auto& a : pair_.prefill) pargs.push_back(a);
  pargs.push_back("--listen=127.0.0.1:" + std::to_string(pair_.prefill_port));
  prefill_ = std::make_unique<DaemonProcess>("prefill", PrefillBin(), pargs, dir_.path());
  std::vector<std::string> dargs = DefaultDaemonFlags();
  for (auto& a : pair_.common) dargs.push_back(a);
  for (auto& a : pair_.decode) dargs.push_back(a);
  dargs.push_back("--listen=" + pair_.decode_listen);
  dargs.push_back("--peer=127.0.0.1:" + std::to_string(pair_.prefill_port));
  decode_ = std::make_unique<DaemonProcess>("decode", DecodeBin(), dargs, dir_.path());
  Status s = prefill_->Spawn();
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = decode_->Spawn();
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = prefill_->WaitReady(DeadlineAfterMs(300000));
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = decode_->WaitReady(DeadlineAfterMs(300000));
  ASSERT_TRUE(s.ok()) << s.ToString();
  stub_ = DecodeStub("127.0.0.1:" + std::to_string(decode_->port()));
}

void DisaggTest::StartDaemons(const DaemonPair& pair) {
  pair_ = pair;
  ASSERT_NO_FATAL_FAILURE(StartPrefill());
  ASSERT_NO_FATAL_FAILURE(StartDecode());
}

std::vector<int32_t> DisaggTest::Colocated(const std::vector<std::string>& model_flags,
                                           const std::vector<int32_t>& prompt, int max_tokens) {
  model::ModelSpec spec;
  std::string key;
  for (const auto& f : model_flags) {
    key += f + " ";
    if (f.rfind("--model=", 0) == 0) spec.model = f.substr(8);
    if (f.rfind("--layers=", 0) == 0) spec.num_layers_override = std::stoi(f.substr(9));
    if (f.rfind("--seed=", 0) == 0) spec.seed = std::stoull(f.substr(7));
  }
  auto& backend = reference_[key];
  if (!backend) {
    model::BackendOptions bo;
    bo.num_threads = 1;
    auto b = model::CreateBackend(spec, bo);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok()) return {};
    backend = std::move(b).value();
  }
  auto pool = backend->CreatePool(
      model::BlocksForTokens(static_cast<int>(prompt.size()) + max_tokens, 16), 16);
  EXPECT_TRUE(pool.ok());
  model::GenerateOptions go;
  go.max_new_tokens = max_tokens;
  auto r = model::Generate(*backend, **pool, prompt, go);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->tokens : std::vector<int32_t>{};
}

}  // namespace kvstream::testing
