// `kvstream bench serve` against a real decode daemon's --http endpoint (and its gRPC Generate,
// grpc://) with its prefill (CPU build, tiny preset): every request completes, the streamed chunks equal the server's usage,
// the multi-turn workload's prompts grow by each answer's token ids (the server's prompt_tokens
// add up), every block comes back; past the admission queue's bound the 429s are counted by kind.
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/daemons/disagg_fixture.h"
#include "tests/daemons/metrics_probe.h"

namespace kvstream::testing {
namespace {

using json = nlohmann::json;

class BenchServeTest : public DisaggTest {
 protected:
  void Start(std::vector<std::string> common, std::vector<std::string> decode) {
    DaemonPair pair;
    pair.common = std::move(common);
    pair.decode = std::move(decode);
    pair.decode.push_back("--http=127.0.0.1:0");
    pair.decode.push_back("--http_port_file=" + dir_.path() + "/http.port");
    ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
    port_ = ReadMetricsPort(dir_.path() + "/http.port", DeadlineAfterMs(10000));
    ASSERT_GT(port_, 0);
  }
  // Runs bench serve with `args` over HTTP (or gRPC Generate); its JSON lines.
  std::vector<json> Bench(const std::string& args, int expect_rc = 0, bool grpc = false) {
    const std::string out = dir_.path() + "/runs" + std::to_string(++runs_) + ".jsonl";
    int rc = 0;
    const std::string url = grpc ? "grpc://" + decode_address() : "http://127.0.0.1:" + std::to_string(port_);
    const std::string log = RunCapture(std::string(KVSTREAM_CLI_BIN) + " bench serve --no-progress --url " + url +
                                           " --json-out " + out + " " + args,
                                       &rc, true);
    EXPECT_EQ(rc, expect_rc) << log;
    std::printf("%s", log.c_str());
    std::vector<json> rows;
    std::ifstream in(out);
    for (std::string line; std::getline(in, line);) rows.push_back(json::parse(line));
    return rows;
  }
  int port_ = 0, runs_ = 0;
};

TEST_F(BenchServeTest, CountsTokensAndMultiTurnAgainstTheDaemons) {
  ASSERT_NO_FATAL_FAILURE(Start({"--model=tiny", "--pool_blocks=64"}, {}));
  // 16 requests of 12 prompt ids and 6 tokens (ignore_eos), 4 in flight, at 50/s then all at once.
  auto rows = Bench("--prompt-format ids --vocab-size 500 --input-len 12 --output-len 6 --num-prompts 16 "
                    "--max-concurrency 4 --ignore-eos --request-rate 50,inf --warmup 2");
  ASSERT_EQ(rows.size(), 2u);
  for (const json& r : rows) {
    EXPECT_EQ(r["model"], "tiny");
    EXPECT_EQ(r["completed"], 16) << r.dump();
    EXPECT_EQ(r["failed"], 0) << r.dump();
    EXPECT_EQ(r["total_output_tokens"], 16 * 6);
    EXPECT_EQ(r["total_streamed_chunks"], 16 * 6);  // one chunk per token, as usage says
    EXPECT_EQ(r["requests_without_usage"], 0);
    EXPECT_EQ(r["total_input_tokens"], 16 * 12);
    EXPECT_GT(r["median_ttft_ms"].get<double>(), 0);
    EXPECT_LE(r["max_concurrent_requests"].get<int>(), 4);
  }
  // 3 conversations x 3 turns, a 16-token system prompt, 4-token messages and answers: the
  // server's prompt_tokens are 20, 28 and 36 per conversation only if every answer's ids (from
  // return_token_ids) were appended.
  rows = Bench("--dataset multiturn --conversations 3 --turns 3 --system-len 16 --input-len 4 "
               "--output-len 4 --prompt-format ids --vocab-size 500 --ignore-eos --request-rate 20");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["completed"], 9) << rows[0].dump();
  EXPECT_EQ(rows[0]["total_input_tokens"], 3 * (20 + 28 + 36));
  EXPECT_EQ(rows[0]["total_output_tokens"], 9 * 4);
  EXPECT_EQ(BlocksNotFree(decode_address(), true, DeadlineAfterMs(10000)), 0);
}

// The gRPC path (grpc://, Generate streams) with the same workloads and definitions as HTTP, in
// every load mode (local: the decode computes the prompt, colocated), and the HTTP path with the
// same modes (kvstream's load_mode extension): the same counts; the multi-turn prompts grow by
// each answer's ids from the stream.
TEST_F(BenchServeTest, GrpcPathSideBySideWithHttp) {
  ASSERT_NO_FATAL_FAILURE(Start({"--model=tiny", "--pool_blocks=64"}, {}));
  const std::string load = "--prompt-format ids --vocab-size 500 --input-len 12 --output-len 6 --num-prompts 12 "
                           "--max-concurrency 4 --ignore-eos --warmup 1 --load-mode ";
  for (const char* mode : {"pipelined", "non-pipelined", "local"}) {
    for (bool grpc : {true, false}) {
      auto rows = Bench(load + mode, 0, grpc);
      ASSERT_EQ(rows.size(), 1u);
      const json& r = rows[0];
      EXPECT_EQ(r["endpoint"], grpc ? "grpc" : "completions");
      EXPECT_EQ(r["load_mode"], mode);
      EXPECT_EQ(r["model"], "tiny");
      EXPECT_EQ(r["completed"], 12) << r.dump();
      EXPECT_EQ(r["failed"], 0) << r.dump();
      EXPECT_EQ(r["total_output_tokens"], 12 * 6);
      EXPECT_EQ(r["total_streamed_chunks"], 12 * 6);
      EXPECT_EQ(r["requests_without_usage"], 0);
      EXPECT_EQ(r["total_input_tokens"], 12 * 12);
      EXPECT_GT(r["median_ttft_ms"].get<double>(), 0);
      EXPECT_GT(r["median_itl_ms"].get<double>(), 0);
      EXPECT_LE(r["max_concurrent_requests"].get<int>(), 4);
    }
  }
  const std::string per_request = dir_.path() + "/requests.jsonl";
  auto rows = Bench("--dataset multiturn --conversations 3 --turns 3 --system-len 16 --input-len 4 "
                    "--output-len 4 --prompt-format ids --vocab-size 500 --ignore-eos --request-rate 20 "
                    "--requests-out " + per_request, 0, true);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["completed"], 9) << rows[0].dump();
  EXPECT_EQ(rows[0]["total_input_tokens"], 3 * (20 + 28 + 36));
  // --requests-out: one line per request, conversation-major, with its ITLs.
  std::ifstream in(per_request);
  int n = 0;
  for (std::string line; std::getline(in, line); ++n) {
    const json q = json::parse(line);
    EXPECT_TRUE(q["ok"].get<bool>()) << line;
    EXPECT_EQ(q["turn"], n % 3) << line;
    EXPECT_EQ(q["prompt_tokens"], 20 + 8 * (n % 3)) << line;
    EXPECT_EQ(q["output_tokens"], 4) << line;
    EXPECT_EQ(q["itl_us"].size(), 3u) << line;
    EXPECT_GE(q["e2el_ms"].get<double>(), q["ttft_ms"].get<double>()) << line;
  }
  EXPECT_EQ(n, 9);
  // Usage errors: no chat, no extra body over gRPC; an unknown mode.
  Bench("--endpoint chat", 2, true);
  Bench("--load-mode colocated --prompt-format ids --vocab-size 500", 2, true);
  EXPECT_EQ(BlocksNotFree(decode_address(), true, DeadlineAfterMs(10000)), 0);
}

// An 8-block pool and a 2-request admission queue: of 12 requests of 68 tokens (5 blocks each)
// sent at once, those past the queue are refused at once (HTTP 429 queue_full, gRPC
// RESOURCE_EXHAUSTED), and counted so.
TEST_F(BenchServeTest, QueueFullIsCountedByKind) {
  ASSERT_NO_FATAL_FAILURE(Start({"--model=tiny", "--pool_blocks=8"}, {"--max_queue=2", "--queue_timeout_ms=60000"}));
  for (bool grpc : {false, true}) {  // over gRPC the refusal is RESOURCE_EXHAUSTED
    auto rows = Bench("--prompt-format ids --vocab-size 500 --input-len 60 --output-len 8 --num-prompts 12 --ignore-eos",
                      0, grpc);
    ASSERT_EQ(rows.size(), 1u);
    const json& r = rows[0];
    EXPECT_EQ(r["completed"].get<int>() + r["failed"].get<int>(), 12);
    EXPECT_GE(r["completed"].get<int>(), 1) << r.dump();
    EXPECT_GE(r["failed"].get<int>(), 1) << r.dump();
    EXPECT_EQ(r["errors"], json({{grpc ? "grpc RESOURCE_EXHAUSTED" : "http 429 (queue_full)", r["failed"]}})) << r.dump();
    EXPECT_EQ(BlocksNotFree(decode_address(), true, DeadlineAfterMs(20000)), 0);
  }
}

}  // namespace
}  // namespace kvstream::testing
