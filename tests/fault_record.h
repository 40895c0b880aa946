// Fault and bad-input cases report what happened, one line each on standard output:
//   KVSTREAM_FAULT {"id": ..., "test": ..., "what": ..., "tries": ..., ...}
// scripts/faults_doc.py turns the lines of a ctest run into docs/faults.md, so the document
// carries the tests' own figures; tests/docs/faults_doc_check keeps every id in it.
// Figures a case does not measure stay -1 and print as "-".
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace kvstream::testing {

struct FaultOutcome {
  int tries = 1;           // times the fault or input was applied
  int requests = -1;       // requests exposed to it
  int lost = -1;           // of those: neither completed nor refused/failed with a clear status
  int wrong_tokens = -1;   // of those: completed with tokens other than colocated generation's
  int blocks_leaked = -1;  // KV blocks not free once everything settled
  int aborts = -1;         // daemons that died without the test killing them
  long bytes_outside = -1; // bytes written outside memory the peer registered
  std::string outcome;     // what the system did, in words
};

inline std::string FaultJsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
      continue;
    }
    out += c;
  }
  return out + "\"";
}

// `id`: a stable name for the case (a string literal: faults_doc_check reads it from the source);
// `what`: the fault or input, in words.
inline void RecordFault(const std::string& id, const std::string& what, const FaultOutcome& o) {
  const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string test = t ? std::string(t->test_suite_name()) + "." + t->name() : "";
  const bool passed = !::testing::Test::HasFailure();
  std::printf(
      "KVSTREAM_FAULT {\"id\": %s, \"test\": %s, \"what\": %s, \"tries\": %d, \"requests\": %d, "
      "\"lost\": %d, \"wrong_tokens\": %d, \"blocks_leaked\": %d, \"aborts\": %d, "
      "\"bytes_outside\": %ld, \"passed\": %s, \"outcome\": %s}\n",
      FaultJsonString(id).c_str(), FaultJsonString(test).c_str(), FaultJsonString(what).c_str(),
      o.tries, o.requests, o.lost, o.wrong_tokens, o.blocks_leaked, o.aborts, o.bytes_outside,
      passed ? "true" : "false", FaultJsonString(o.outcome).c_str());
  std::fflush(stdout);
}

}  // namespace kvstream::testing
