// The OpenAI-compatible HTTP endpoint (--http) of a real decode daemon, with its prefill, driven
// by curl and by tests/daemons/http_client.py (Python's standard library only): completions
// streamed and not, token for token the gRPC path's for the same prompt and seed; every error
// case in OpenAI's shape; a client closing mid-stream frees its blocks; many concurrent streams;
// a clean 429 past the admission queue's bound; the client token; the loopback rule.
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/daemons/disagg_fixture.h"
#include "tests/daemons/metrics_probe.h"
#include "tokenizer/tokenizer.h"

namespace kvstream::testing {
namespace {

namespace v1 = kvstream::v1;
using json = nlohmann::json;

struct Text {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::string text;
};

Text GrpcText(v1::Decode::Stub& stub, const v1::GenerateRequest& req) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse msg;
  Text r;
  while (reader->Read(&msg)) {
    r.tokens.push_back(msg.token_id());
    r.text += msg.text();
  }
  r.status = reader->Finish();
  return r;
}

// The decode's KV blocks not free once they settle (Stats with the client token); -1: no answer.
int BlocksNotFreeWithToken(v1::Decode::Stub& stub, const std::string& token, Deadline deadline) {
  int busy = -1;
  while (true) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token);
    v1::StatsResponse r;
    if (stub.Stats(&ctx, v1::StatsRequest(), &r).ok()) {
      busy = r.pool().num_blocks() - r.pool().free_blocks();
      if (busy == 0 && r.requests_in_flight() == 0) return 0;
    }
    if (Clock::now() >= deadline) return busy;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

class HttpTest : public DisaggTest {
 protected:
  void StartWithHttp(std::vector<std::string> common, std::vector<std::string> decode) {
    DaemonPair pair;
    pair.common = std::move(common);
    pair.decode = {"--http=127.0.0.1:0", "--http_port_file=" + dir_.path() + "/http.port"};
    for (auto& d : decode) pair.decode.push_back(d);
    ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
    port_ = ReadMetricsPort(dir_.path() + "/http.port", DeadlineAfterMs(10000));
    ASSERT_GT(port_, 0);
  }
  // http_client.py <mode> [arg]; its output, *rc its exit code.
  std::string Client(const std::string& model, const std::string& mode, const std::string& arg,
                     int* rc, const std::string& token = "") {
    return RunCapture("python3 " + std::string(KVSTREAM_SOURCE_DIR) + "/tests/daemons/http_client.py --port " +
                          std::to_string(port_) + " --model " + model +
                          (token.empty() ? "" : " --token " + token) + " " + mode + " " + arg,
                      rc, true);
  }
  std::string Curl(const std::string& args, int* rc) {
    return RunCapture("curl -sS --max-time 120 " + args, rc, true);
  }
  std::string Url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }
  int port_ = 0;
};

TEST_F(HttpTest, CompletionsEqualGrpcAndEveryErrorCase) {
  const std::string ck = dir_.path() + "/ck";
  int rc = 0;
  std::string out = RunCapture(std::string(KVSTREAM_CLI_BIN) + " make-checkpoint --model tiny --out " + ck, &rc, true);
  ASSERT_EQ(rc, 0) << out;
  std::ofstream(ck + "/tokenizer.json") << SmallTokenizerJson(KVSTREAM_TOKENIZER_DATA);
  auto tok = tokenizer::Tokenizer::Load(ck);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  ASSERT_NO_FATAL_FAILURE(StartWithHttp({"--model=" + ck, "--pool_blocks=64"}, {}));

  // The gRPC path's tokens: sampled with a seed, and greedy from the same prompt's ids.
  const std::string prompt = "Hello, world! The answer is 42.";
  const int max_tokens = 12;
  v1::GenerateRequest req;
  req.set_prompt_text(prompt);
  req.set_max_tokens(max_tokens);
#if KVSTREAM_PROTO_HAS_SAMPLING
  const double temperature = 0.8;
  req.mutable_sampling()->set_temperature(float(temperature));
  req.mutable_sampling()->set_seed(7);
#else
  const double temperature = 0;  // greedy only until sampling is in the API
#endif
  const Text sampled = GrpcText(*stub_, req);
  ASSERT_TRUE(sampled.status.ok()) << sampled.status.error_message();
  const auto ids = (*tok)->Encode(prompt).value();
  const auto greedy = CallGenerate(*stub_, ids, max_tokens, v1::LOAD_MODE_DEFAULT, 120000);
  ASSERT_TRUE(greedy.status.ok()) << greedy.status.error_message();
  std::string stop;  // a printable piece of the sampled text, to stop at
  for (size_t i = 1; i < sampled.tokens.size() && stop.empty(); ++i) {
    const std::string piece = (*tok)->Decode(std::vector<int32_t>{sampled.tokens[i]}, true).value();
    bool printable = piece.size() >= 2;
    for (const char c : piece) printable = printable && c > ' ' && c < 0x7f;
    if (printable) stop = piece;
  }
  json exp = {{"prompt", prompt}, {"prompt_ids", ids}, {"prompt_tokens", ids.size()},
              {"max_tokens", max_tokens}, {"temperature", temperature}, {"seed", 7},
              {"sampling", KVSTREAM_PROTO_HAS_SAMPLING != 0},
              {"tokens", sampled.tokens}, {"text", sampled.text}, {"greedy_tokens", greedy.tokens},
              {"stop", stop}, {"max_position", 4096}};
  std::ofstream(dir_.path() + "/expected.json") << exp.dump();

  out = Client("ck", "basic", dir_.path() + "/expected.json", &rc);
  EXPECT_EQ(rc, 0) << out;
  std::printf("%s", out.c_str());

  // curl: a stream ends with data: [DONE]; errors carry their status.
  out = Curl("-N -H 'Content-Type: application/json' -d '{\"model\":\"ck\",\"prompt\":\"Hello\","
             "\"max_tokens\":4,\"stream\":true,\"temperature\":0}' " + Url("/v1/completions"), &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out.substr(out.size() - std::min<size_t>(out.size(), 14)), "data: [DONE]\n\n") << out;
  size_t events = 0;
  for (size_t p = out.find("data: "); p != std::string::npos; p = out.find("data: ", p + 1)) ++events;
  EXPECT_EQ(events, 5u) << out;
  out = Curl("-o /dev/null -w '%{http_code}' -d '{\"model\":' " + Url("/v1/completions"), &rc);
  EXPECT_EQ(out, "400");
  out = Curl("-w ' %{http_code}' " + Url("/v1/models"), &rc);
  EXPECT_NE(out.find("\"id\":\"ck\""), std::string::npos) << out;
  EXPECT_NE(out.find(" 200"), std::string::npos) << out;
  // A checkpoint without a chat template: chats are a 400 saying so.
  out = Curl("-w ' %{http_code}' -d '{\"model\":\"ck\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}' " +
                 Url("/v1/chat/completions"), &rc);
  EXPECT_NE(out.find("\"code\":\"chat_template_not_found\""), std::string::npos) << out;
  EXPECT_NE(out.find("no chat template"), std::string::npos) << out;
  EXPECT_NE(out.find(" 400"), std::string::npos) << out;
  EXPECT_EQ(BlocksNotFree(decode_address(), true, DeadlineAfterMs(10000)), 0);

  // A client closing mid-stream cancels its request: every block comes back.
  const uint64_t cancelled_before = CallStats(*stub_).value().counters().requests_cancelled();
  out = Client("ck", "disconnect", "", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(BlocksNotFree(decode_address(), true, DeadlineAfterMs(10000)), 0);
  EXPECT_EQ(CallStats(*stub_).value().counters().requests_cancelled(), cancelled_before + 1);
}

// POST /v1/chat/completions with the checkpoint's chat template (Llama 3's, with test hooks that
// raise, use an unsupported construct or run past the work bound): the prompt ids equal Python
// Jinja2's rendering encoded by the tokenizer without added special tokens (as transformers'
// apply_chat_template), the tokens equal gRPC Generate's on those ids; streaming, errors.
TEST_F(HttpTest, ChatCompletionsMatchJinja2AndGrpc) {
  const std::string ck = dir_.path() + "/ck";
  int rc = 0;
  std::string out = RunCapture(std::string(KVSTREAM_CLI_BIN) + " make-checkpoint --model tiny --out " + ck, &rc, true);
  ASSERT_EQ(rc, 0) << out;
  // Llama 3's header and end-of-turn markers as special tokens of the small tokenizer.
  json tj = json::parse(SmallTokenizerJson(KVSTREAM_TOKENIZER_DATA));
  const char* marks[] = {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
  for (int i = 0; i < 3; ++i) tj["added_tokens"][1 + i]["content"] = marks[i];
  std::ofstream(ck + "/tokenizer.json") << tj.dump();
  std::ifstream in(std::string(KVSTREAM_SOURCE_DIR) + "/tests/data/chat_templates/llama3.jinja");
  const std::string llama3((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(llama3.empty());
  const std::string hooks =
      "{%- if messages[0]['content'] == 'RAISE' %}{{ raise_exception('this test template refuses RAISE') }}{% endif %}\n"
      "{%- if messages[0]['content'] == 'UNSUPPORTED' %}{{ '%s' % 'x' }}{% endif %}\n"
      "{%- if messages[0]['content'] == 'LOOP' %}{% for i in range(100000) %}{% for j in range(100000) %}"
      "{% endfor %}{% endfor %}{% endif %}\n";
  std::ofstream(ck + "/tokenizer_config.json")
      << json({{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}, {"chat_template", hooks + llama3}}).dump();
  auto tok = tokenizer::Tokenizer::Load(ck);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  ASSERT_NO_FATAL_FAILURE(StartWithHttp({"--model=" + ck, "--pool_blocks=64"}, {}));

  out = Client("ck", "chat", ck, &rc);
  if (rc == 77) GTEST_SKIP() << out;
  ASSERT_EQ(rc, 0) << out;
  std::printf("%s", out.c_str());
  std::ifstream results_file(ck + "/chat_results.json");
  const json results = json::parse(results_file);
  ASSERT_EQ(results.size(), 5u);
  for (const json& r : results) {
    auto ids = (*tok)->Encode(r["rendered"].get<std::string>(), /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    EXPECT_EQ(r["prompt_token_ids"].get<std::vector<int32_t>>(), *ids) << r["rendered"];
    const auto greedy = CallGenerate(*stub_, *ids, 6, v1::LOAD_MODE_DEFAULT, 120000);
    ASSERT_TRUE(greedy.status.ok()) << greedy.status.error_message();
    EXPECT_EQ(r["token_ids"].get<std::vector<int32_t>>(), greedy.tokens) << r["rendered"];
  }
  // The special tokens came through as single ids (the template wrote them; nothing was added).
  const auto first = results[0]["prompt_token_ids"].get<std::vector<int32_t>>();
  ASSERT_GE(first.size(), 3u);
  EXPECT_EQ(first[0], 500);
  EXPECT_EQ(first[1], 501);

  // curl: a streamed chat.
  out = Curl("-N -d '{\"model\":\"ck\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
             "\"max_tokens\":3,\"stream\":true,\"temperature\":0}' " + Url("/v1/chat/completions"), &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"role\":\"assistant\""), std::string::npos) << out;
  EXPECT_NE(out.find("chat.completion.chunk"), std::string::npos) << out;
  EXPECT_EQ(out.substr(out.size() - std::min<size_t>(out.size(), 14)), "data: [DONE]\n\n") << out;
  EXPECT_EQ(BlocksNotFree(decode_address(), true, DeadlineAfterMs(10000)), 0);
}

// Many concurrent streams (KVSTREAM_HTTP_STREAMS, default 1000; 200 in the sanitizer build): the
// pool holds every request at once (one 16-token block each: 4 prompt + 8 generated tokens) and
// the admission queue has room for all of them; no error, and every block comes back.
TEST_F(HttpTest, ManyConcurrentStreams) {
  const char* env = std::getenv("KVSTREAM_HTTP_STREAMS");
  const int n = env && *env ? std::atoi(env) : KVSTREAM_HTTP_STREAMS_DEFAULT;
  ASSERT_NO_FATAL_FAILURE(StartWithHttp({"--model=tiny", "--pool_blocks=" + std::to_string(n + 8)},
                                        {"--max_queue=" + std::to_string(n), "--max_batch=64"}));
  int rc = 0;
  const std::string out = Client("tiny", "concurrent", std::to_string(n), &rc);
  EXPECT_EQ(rc, 0) << out;
  std::printf("%s", out.c_str());
  EXPECT_EQ(BlocksNotFree(decode_address(), true, DeadlineAfterMs(20000)), 0);
}

// Past the admission queue's bound a request is refused at once with 429 in OpenAI's shape; a
// client token guards /v1/*; off loopback --http needs a credential.
TEST_F(HttpTest, QueueBoundAndClientToken) {
  const std::string token = "http-test-client-token-0123456789";
  std::ofstream(dir_.path() + "/client.token") << token << "\n";
  ASSERT_NO_FATAL_FAILURE(StartWithHttp(
      {"--model=tiny", "--pool_blocks=8"},
      {"--max_queue=2", "--queue_timeout_ms=60000", "--client_token_file=" + dir_.path() + "/client.token"}));
  int rc = 0;
  std::string out = Client("tiny", "overload", "12", &rc, token);  // 68 tokens: 5 of 8 blocks
  EXPECT_EQ(rc, 0) << out;
  std::printf("%s", out.c_str());
  out = Client("tiny", "auth", "", &rc, token);
  EXPECT_EQ(rc, 0) << out;
  out = Curl("-o /dev/null -w '%{http_code}' " + Url("/v1/models"), &rc);
  EXPECT_EQ(out, "401");
  out = Curl("-o /dev/null -w '%{http_code}' -H 'Authorization: Bearer " + token + "' " + Url("/v1/models"), &rc);
  EXPECT_EQ(out, "200");
  EXPECT_EQ(BlocksNotFreeWithToken(*stub_, token, DeadlineAfterMs(20000)), 0);

  out = RunCapture(DecodeBin() + " --model=tiny --peer=127.0.0.1:1 --http=0.0.0.0:0", &rc, true);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("http 0.0.0.0:0 is not a loopback address"), std::string::npos) << out;
}

// With --tls_cert/--tls_key/--tls_ca the endpoint is HTTPS and, like the gRPC listener, needs a
// client certificate signed by the CA.
TEST_F(HttpTest, TlsWithClientCertificate) {
  const std::string d = dir_.path();
  ASSERT_NO_FATAL_FAILURE(MakeCa(d, "ca"));
  ASSERT_NO_FATAL_FAILURE(MakeCa(d, "ca2"));
  for (const char* name : {"prefill", "decode", "client"}) ASSERT_NO_FATAL_FAILURE(MakeCert(d, "ca", name, name));
  ASSERT_NO_FATAL_FAILURE(MakeCert(d, "ca2", "client2", "client2"));
  auto tls = [&](const std::string& n) {
    return std::vector<std::string>{"--tls_cert=" + d + "/" + n + ".pem", "--tls_key=" + d + "/" + n + ".key",
                                    "--tls_ca=" + d + "/ca.pem"};
  };
  DaemonPair pair;
  pair.common = {"--model=tiny", "--pool_blocks=16"};
  pair.prefill = tls("prefill");
  pair.prefill.push_back("--tls_peer_names=decode");
  pair.decode = tls("decode");
  pair.decode.push_back("--http=127.0.0.1:0");
  pair.decode.push_back("--http_port_file=" + d + "/http.port");
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  port_ = ReadMetricsPort(d + "/http.port", DeadlineAfterMs(10000));
  ASSERT_GT(port_, 0);
  const std::string https = "https://127.0.0.1:" + std::to_string(port_);
  const std::string client = "--cacert " + d + "/ca.pem --cert " + d + "/client.pem --key " + d + "/client.key ";
  int rc = 0;
  std::string out = Curl(client + "-w ' %{http_code}' " + https + "/v1/models", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(" 200"), std::string::npos) << out;
  out = Curl(client + "-N -d '{\"model\":\"tiny\",\"prompt\":[1,2,3],\"max_tokens\":3,\"stream\":true}' " +
                 https + "/v1/completions", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("data: [DONE]"), std::string::npos) << out;
  // No client certificate, one from another CA, or plaintext: no answer.
  out = Curl("--cacert " + d + "/ca.pem " + https + "/v1/models", &rc);
  EXPECT_NE(rc, 0) << out;
  out = Curl("--cacert " + d + "/ca.pem --cert " + d + "/client2.pem --key " + d + "/client2.key " + https + "/health", &rc);
  EXPECT_NE(rc, 0) << out;
  out = Curl(Url("/health"), &rc);
  EXPECT_NE(rc, 0) << out;
}

}  // namespace
}  // namespace kvstream::testing
