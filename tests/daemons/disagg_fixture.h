// Fixture: one prefill and one decode daemon on loopback, plus the colocated reference.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "model/backend.h"
#include "model/generate.h"
#include "tests/daemons/daemon_harness.h"

namespace kvstream::testing {

struct DaemonPair {
  std::vector<std::string> common;   // flags for both
  std::vector<std::string> prefill;  // extra prefill flags
  std::vector<std::string> decode;   // extra decode flags
  std::vector<std::string> prefill_prefix, decode_prefix;  // e.g. ip netns exec
  int prefill_port = 0;              // 0: any
  std::string prefill_host = "127.0.0.1";
  std::string decode_listen = "127.0.0.1:0";
};

// The daemon binaries: $KVSTREAM_PREFILL_BIN / $KVSTREAM_DECODE_BIN if set, else the build's.
std::string PrefillBin();
std::string DecodeBin();

// Flags every test daemon gets: UCX over TCP (KVSTREAM_TEST_UCX_TLS overrides) on the loopback
// device only (KVSTREAM_TEST_UCX_NET_DEVICES overrides; empty = every device UCX finds), one
// compute thread each (two daemons share CI's two cores), no drain delay after SIGTERM.
std::vector<std::string> DefaultDaemonFlags();

// Runs `cmd` through the shell and returns its standard output (and its standard error too when
// `with_stderr`); *rc = the exit code, -1 if it did not exit normally or could not start.
std::string RunCapture(const std::string& cmd, int* rc, bool with_stderr = false);

// The committed Llama 3 style test tokenizer (under `tokenizer_data`, tests/tokenizer/data) cut to
// its first 500 tokens (bytes, then merges in order) plus <|begin_of_text|> at 500 and special
// tokens up to 511: the tiny preset's vocabulary, as a tokenizer.json document.
std::string SmallTokenizerJson(const std::string& tokenizer_data);

// The openssl CLI, in `dir`: a CA (<ca>.pem/.key) and certificates signed by it (<file>.pem/.key)
// whose CN and DNS SAN are `name` (plus localhost and IP 127.0.0.1, the address the tests dial).
void MakeCa(const std::string& dir, const std::string& ca);
void MakeCert(const std::string& dir, const std::string& ca, const std::string& name,
              const std::string& file);

class DisaggTest : public ::testing::Test {
 protected:
  void TearDown() override;
  // Starts prefill, then decode pointed at it.
  void StartDaemons(const DaemonPair& pair);
  // Both at once (model loading overlaps): the prefill gets a fixed port picked beforehand,
  // the decode handshakes lazily once the prefill serves.
  void StartDaemonsTogether(const DaemonPair& pair);
  void StartPrefill();
  void StartDecode();

  // Greedy tokens of the same model in this process.
  std::vector<int32_t> Colocated(const std::vector<std::string>& model_flags,
                                 const std::vector<int32_t>& prompt, int max_tokens);

  std::string prefill_address() const;
  std::string decode_address() const { return decode_->address(); }

  TempDir dir_;
  DaemonPair pair_;
  std::unique_ptr<DaemonProcess> prefill_, decode_;
  std::unique_ptr<kvstream::v1::Decode::Stub> stub_;
  std::map<std::string, std::unique_ptr<model::ModelBackend>> reference_;
};

}  // namespace kvstream::testing
