// The OpenAI completions protocol: every request field parsed (and refused) as docs/http.md says,
// errors in OpenAI's shape with the right HTTP status, response and chunk JSON, and the SSE /
// chunked framing byte for byte.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "frontend/openai_protocol.h"
#include "frontend/sse.h"

namespace kvstream::frontend {
namespace {

using json = nlohmann::json;
namespace v1 = kvstream::v1;

CompletionRequest Ok(const std::string& body) {
  auto r = ParseCompletionRequest(body, "tiny");
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << body << ": " << e->message;
    return {};
  }
  return std::get<CompletionRequest>(r);
}

ApiError Err(const std::string& body) {
  auto r = ParseCompletionRequest(body, "tiny");
  if (!std::holds_alternative<ApiError>(r)) {
    ADD_FAILURE() << body << " was accepted";
    return {};
  }
  return std::get<ApiError>(r);
}

TEST(OpenAiProtocol, PromptForms) {
  EXPECT_EQ(Ok(R"({"model":"tiny","prompt":"Hello"})").prompt_text, "Hello");
  EXPECT_EQ(Ok(R"({"model":"tiny","prompt":["Hello"]})").prompt_text, "Hello");
  EXPECT_EQ(Ok(R"({"model":"tiny","prompt":[1,2,3]})").prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(Ok(R"({"model":"tiny","prompt":[[4,5]]})").prompt_tokens, (std::vector<int32_t>{4, 5}));
  for (const char* bad : {R"({"model":"tiny","prompt":""})", R"({"model":"tiny","prompt":[]})",
                          R"({"model":"tiny","prompt":[[]]})", R"({"model":"tiny","prompt":[1,-2]})",
                          R"({"model":"tiny","prompt":[1.5]})", R"({"model":"tiny","prompt":{"a":1}})",
                          R"({"model":"tiny","prompt":7})", R"({"model":"tiny"})"}) {
    const ApiError e = Err(bad);
    EXPECT_EQ(e.http_status, 400) << bad;
    EXPECT_EQ(e.param, "prompt") << bad;
  }
  const ApiError two = Err(R"({"model":"tiny","prompt":["a","b"]})");
  EXPECT_EQ(two.http_status, 400);
  EXPECT_NE(two.message.find("one prompt per request"), std::string::npos) << two.message;
}

// kvstream's extension load_mode picks gRPC's LoadMode (bench serve's --load-mode over HTTP).
TEST(OpenAiProtocol, LoadModeExtension) {
  EXPECT_EQ(ToGenerateRequest(Ok(R"({"model":"tiny","prompt":[3,4]})")).load_mode(), v1::LOAD_MODE_DEFAULT);
  EXPECT_EQ(ToGenerateRequest(Ok(R"({"model":"tiny","prompt":[3,4],"load_mode":"pipelined"})")).load_mode(),
            v1::LOAD_MODE_PIPELINED);
  EXPECT_EQ(ToGenerateRequest(Ok(R"({"model":"tiny","prompt":[3,4],"load_mode":"non-pipelined"})")).load_mode(),
            v1::LOAD_MODE_NON_PIPELINED);
  EXPECT_EQ(ToGenerateRequest(Ok(R"({"model":"tiny","prompt":[3,4],"load_mode":"local"})")).load_mode(),
            v1::LOAD_MODE_LOCAL);
  EXPECT_EQ(ToGenerateRequest(Ok(R"({"model":"tiny","prompt":[3,4],"load_mode":null})")).load_mode(),
            v1::LOAD_MODE_DEFAULT);
  EXPECT_EQ(Err(R"({"model":"tiny","prompt":[3,4],"load_mode":"colocated"})").param, "load_mode");
  EXPECT_EQ(Err(R"({"model":"tiny","prompt":[3,4],"load_mode":3})").param, "load_mode");
}

// cache_salt (vLLM's): the KV cache's per-tenant salt, passed on; empty, too long or not a string
// is refused naming it.
TEST(OpenAiProtocol, CacheSalt) {
  EXPECT_EQ(ToGenerateRequest(Ok(R"({"model":"tiny","prompt":[3,4],"cache_salt":"tenant-a"})")).cache_salt(),
            "tenant-a");
  EXPECT_EQ(ToGenerateRequest(Ok(R"({"model":"tiny","prompt":[3,4]})")).cache_salt(), "");
  EXPECT_EQ(Err(R"({"model":"tiny","prompt":[3,4],"cache_salt":""})").param, "cache_salt");
  EXPECT_EQ(Err(R"({"model":"tiny","prompt":[3,4],"cache_salt":7})").param, "cache_salt");
  EXPECT_EQ(Err(R"({"model":"tiny","prompt":[3,4],"cache_salt":")" + std::string(257, 'x') + R"("})").param,
            "cache_salt");
}

TEST(OpenAiProtocol, EveryField) {
  const auto parsed = ParseCompletionRequest(R"({"model":"tiny","prompt":"x","max_tokens":7,"stream":true,
      "stream_options":{"include_usage":true},"stop":["a","b"],"temperature":0.5,"top_p":0.9,
      "min_p":0.05,"top_k":40,"seed":12345678901,"logprobs":3,"ignore_eos":true,
      "return_token_ids":true,"user":"u","n":1,"best_of":1,"echo":false,"presence_penalty":0,
      "frequency_penalty":0.0,"repetition_penalty":1.0,"logit_bias":{},"suffix":null})", "tiny");
#if KVSTREAM_PROTO_HAS_SAMPLING
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(parsed)) << std::get<ApiError>(parsed).message;
  const CompletionRequest r = std::get<CompletionRequest>(parsed);
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_DOUBLE_EQ(*r.temperature, 0.5);
  EXPECT_DOUBLE_EQ(*r.top_p, 0.9);
  EXPECT_DOUBLE_EQ(*r.min_p, 0.05);
  EXPECT_EQ(r.top_k, 40);
  EXPECT_EQ(*r.seed, 12345678901u);
  EXPECT_EQ(*r.logprobs, 3);
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_TRUE(r.return_token_ids);
#else
  ASSERT_TRUE(std::holds_alternative<ApiError>(parsed));
  EXPECT_EQ(std::get<ApiError>(parsed).param, "temperature");
#endif
  EXPECT_EQ(Ok(R"({"model":"tiny","prompt":"x","stop":"z"})").stop, std::vector<std::string>{"z"});
  EXPECT_EQ(Ok(R"({"model":"tiny","prompt":"x","top_k":-1})").top_k, 0);
  EXPECT_EQ(Ok(R"({"model":"tiny","prompt":"x","max_tokens":null})").max_tokens, 16);
  EXPECT_EQ(Ok(R"({"model":"tiny","prompt":"x","max_tokens":5.0})").max_tokens, 5);

#if KVSTREAM_PROTO_HAS_SAMPLING
  const v1::GenerateRequest g = ToGenerateRequest(r);
  EXPECT_EQ(g.prompt_text(), "x");
  EXPECT_EQ(g.max_tokens(), 7);
  EXPECT_EQ(g.stop_strings_size(), 2);
  EXPECT_TRUE(g.ignore_eos());
  EXPECT_FLOAT_EQ(g.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(g.sampling().top_p(), 0.9f);
  EXPECT_FLOAT_EQ(g.sampling().min_p(), 0.05f);
  EXPECT_EQ(g.sampling().top_k(), 40);
  EXPECT_EQ(g.sampling().seed(), 12345678901u);
  EXPECT_TRUE(g.sampling().logprobs());
  EXPECT_EQ(g.sampling().top_logprobs(), 3);
  // OpenAI's default temperature is 1; token ids go as ids.
  const v1::GenerateRequest d = ToGenerateRequest(Ok(R"({"model":"tiny","prompt":[3,4]})"));
  EXPECT_FLOAT_EQ(d.sampling().temperature(), 1.0f);
  EXPECT_FALSE(d.sampling().has_seed());
  EXPECT_EQ(d.prompt_tokens_size(), 2);
  EXPECT_EQ(d.max_tokens(), 16);
#else
  // Greedy only until sampling is in the API: every sampling field is refused, naming it.
  EXPECT_EQ(Err(R"({"model":"tiny","prompt":"x","temperature":0.5})").param, "temperature");
  EXPECT_EQ(Err(R"({"model":"tiny","prompt":"x","top_p":0.5})").param, "top_p");
  EXPECT_EQ(Err(R"({"model":"tiny","prompt":"x","top_k":4})").param, "top_k");
  EXPECT_EQ(Err(R"({"model":"tiny","prompt":"x","min_p":0.1})").param, "min_p");
  EXPECT_EQ(Err(R"({"model":"tiny","prompt":"x","logprobs":1})").param, "logprobs");
  const v1::GenerateRequest g = ToGenerateRequest(
      Ok(R"({"model":"tiny","prompt":"x","max_tokens":7,"stop":["a","b"],"temperature":0,"seed":3})"));
  EXPECT_EQ(g.prompt_text(), "x");
  EXPECT_EQ(g.max_tokens(), 7);
  EXPECT_EQ(g.stop_strings_size(), 2);
  EXPECT_EQ(ToGenerateRequest(Ok(R"({"model":"tiny","prompt":[3,4]})")).prompt_tokens_size(), 2);
#endif
}

TEST(OpenAiProtocol, RefusedFields) {
  struct Case {
    const char* body;
    const char* param;
  } cases[] = {
      {R"({"model":"tiny","prompt":"x","max_tokens":0})", "max_tokens"},
      {R"({"model":"tiny","prompt":"x","max_tokens":-3})", "max_tokens"},
      {R"({"model":"tiny","prompt":"x","max_tokens":1e12})", "max_tokens"},
      {R"({"model":"tiny","prompt":"x","max_tokens":"8"})", "max_tokens"},
      {R"({"model":"tiny","prompt":"x","n":2})", "n"},
      {R"({"model":"tiny","prompt":"x","best_of":3})", "best_of"},
      {R"({"model":"tiny","prompt":"x","echo":true})", "echo"},
      {R"({"model":"tiny","prompt":"x","presence_penalty":0.5})", "presence_penalty"},
      {R"({"model":"tiny","prompt":"x","frequency_penalty":1})", "frequency_penalty"},
      {R"({"model":"tiny","prompt":"x","logit_bias":{"1":2}})", "logit_bias"},
      {R"({"model":"tiny","prompt":"x","suffix":"s"})", "suffix"},
      {R"({"model":"tiny","prompt":"x","stream":"yes"})", "stream"},
      {R"({"model":"tiny","prompt":"x","stream_options":{"other":1}})", "stream_options"},
      {R"({"model":"tiny","prompt":"x","stop":[1]})", "stop"},
      {R"({"model":"tiny","prompt":"x","temperature":"hot"})", "temperature"},
      {R"({"model":"tiny","prompt":"x","top_k":-2})", "top_k"},
      {R"({"model":"tiny","prompt":"x","seed":-1})", "seed"},
      {R"({"model":"tiny","prompt":"x","logprobs":21})", "logprobs"},
      {R"({"model":"tiny","prompt":"x","logprobs":true})", "logprobs"},
      {R"({"model":"tiny","prompt":"x","frobnicate":1})", "frobnicate"},
      {R"({"model":7,"prompt":"x"})", "model"},
      {R"({"prompt":"x"})", "model"},
  };
  for (const Case& c : cases) {
    const ApiError e = Err(c.body);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.type, "invalid_request_error") << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_NE(e.message.find(c.param), std::string::npos) << c.body << ": " << e.message;
  }
  for (const char* bad : {"", "{", "[1,2]", "null", "\"x\"", "{\"model\":\"tiny\",}"}) {
    const ApiError e = Err(bad);
    EXPECT_EQ(e.http_status, 400) << bad;
    EXPECT_TRUE(e.param.empty()) << bad;
  }
  const ApiError unknown = Err(R"({"model":"gpt-4","prompt":"x"})");
  EXPECT_EQ(unknown.http_status, 404);
  EXPECT_EQ(unknown.code, "model_not_found");
  EXPECT_EQ(unknown.param, "model");
}

TEST(OpenAiProtocol, ErrorShapeAndStatus) {
  const std::string body = ErrorBody({400, "bad \"x\"", "invalid_request_error", "n", ""});
  EXPECT_EQ(body, R"({"error":{"code":null,"message":"bad \"x\"","param":"n","type":"invalid_request_error"}})");
  const json j = json::parse(ErrorBody({429, "full", "server_overloaded", "", "queue_full"}));
  EXPECT_EQ(j["error"]["code"], "queue_full");
  EXPECT_TRUE(j["error"]["param"].is_null());
  EXPECT_EQ(ErrorFromStatus(InvalidArgument("prompt too long")).http_status, 400);
  EXPECT_EQ(ErrorFromStatus(ResourceExhausted("admission queue full: 3 requests")).http_status, 429);
  EXPECT_EQ(ErrorFromStatus(ResourceExhausted("KV pool full: need 3 blocks")).http_status, 503);
  EXPECT_EQ(ErrorFromStatus(Unavailable("draining")).http_status, 503);
  EXPECT_EQ(ErrorFromStatus(Timeout("deadline")).http_status, 504);
  EXPECT_EQ(ErrorFromStatus(Internal("bug")).http_status, 500);
  // Not valid UTF-8 in a message: replaced, still JSON.
  EXPECT_NO_THROW(json::parse(ErrorBody({400, "bad \xff byte", "invalid_request_error", "", ""})));
}

struct IdText : TokenText {
  std::string Text(int32_t id) const override { return "<" + std::to_string(id) + ">"; }
};

v1::GenerateResponse Msg(int32_t id, const std::string& text, bool last, float lp = -0.5f) {
  v1::GenerateResponse m;
  m.set_token_id(id);
  m.set_text(text);
  m.set_last(last);
#if KVSTREAM_PROTO_HAS_SAMPLING
  m.set_logprob(lp);
  auto* t = m.add_top_logprobs();
  t->set_token_id(id);
  t->set_logprob(lp);
#endif
  return m;
}

TEST(OpenAiProtocol, ChunksAndResponse) {
  CompletionRequest req = Ok(R"({"model":"tiny","prompt":"x","max_tokens":2,"return_token_ids":true})");
  CompletionBuilder b("cmpl-1", 1700000000, "tiny", req, nullptr);
  EXPECT_EQ(b.Chunk(Msg(5, "He", false)),
            R"({"id":"cmpl-1","object":"text_completion","created":1700000000,"model":"tiny","choices":[{"finish_reason":null,"index":0,"logprobs":null,"text":"He","token_ids":[5]}]})");
  EXPECT_EQ(b.Chunk(Msg(6, "llo", true)),
            R"({"id":"cmpl-1","object":"text_completion","created":1700000000,"model":"tiny","choices":[{"finish_reason":"length","index":0,"logprobs":null,"text":"llo","token_ids":[6]}]})");
  EXPECT_EQ(b.UsageChunk(3),
            R"({"id":"cmpl-1","object":"text_completion","created":1700000000,"model":"tiny","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}})");
  const json r = json::parse(b.Response(3));
  EXPECT_EQ(r["choices"][0]["text"], "Hello");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["choices"][0]["token_ids"], json::array({5, 6}));
  EXPECT_EQ(r["usage"]["total_tokens"], 5);

#if KVSTREAM_PROTO_HAS_SAMPLING
  // A stop string: "stop"; logprobs in the legacy completions shape.
  req = Ok(R"({"model":"tiny","prompt":"x","max_tokens":9,"logprobs":1})");
  IdText names;
  CompletionBuilder s("cmpl-2", 1, "tiny", req, &names);
  s.Chunk(Msg(5, "ab", false, -0.25f));
  v1::GenerateResponse last = Msg(7, "c", true, -1.0f);
  last.set_stop_string("d");
  const json c = json::parse(s.Chunk(last));
  EXPECT_EQ(c["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(c["choices"][0]["logprobs"]["tokens"], json::array({"<7>"}));
  EXPECT_EQ(c["choices"][0]["logprobs"]["text_offset"], json::array({2}));
  const json full = json::parse(s.Response(1));
  const json& lp = full["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json::array({"<5>", "<7>"}));
  EXPECT_DOUBLE_EQ(lp["token_logprobs"][0].get<double>(), -0.25);
  EXPECT_DOUBLE_EQ(lp["top_logprobs"][1]["<7>"].get<double>(), -1.0);
  EXPECT_EQ(lp["text_offset"], json::array({0, 2}));
#endif
  // Stopped early by an end-of-sequence token: "stop".
  v1::GenerateResponse eos;
  eos.set_last(true);
  EXPECT_EQ(FinishReason(eos, 3, 9), "stop");
  EXPECT_EQ(FinishReason(eos, 9, 9), "length");
}

ChatRequest ChatOk(const std::string& body) {
  auto r = ParseChatRequest(body, "tiny");
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << body << ": " << e->message;
    return {};
  }
  return std::get<ChatRequest>(r);
}

ApiError ChatErr(const std::string& body) {
  auto r = ParseChatRequest(body, "tiny");
  if (!std::holds_alternative<ApiError>(r)) {
    ADD_FAILURE() << body << " was accepted";
    return {};
  }
  return std::get<ApiError>(r);
}

TEST(OpenAiChat, MessagesAndFields) {
  const ChatRequest c = ChatOk(R"({"model":"tiny","messages":[{"role":"system","content":"Be brief."},
      {"role":"user","content":[{"type":"text","text":"Hi"},{"type":"text","text":"there"}],"name":"u"},
      {"role":"assistant","content":null}],"max_completion_tokens":5,"stream":true,
      "stream_options":{"include_usage":true},"stop":"x","seed":3,"temperature":0,
      "tools":[],"tool_choice":"none","response_format":{"type":"text"},"n":1,"user":"u"})");
  ASSERT_EQ(c.messages.size(), 3u);
  EXPECT_EQ(c.messages[1]["content"], "Hi\nthere");
  EXPECT_EQ(c.messages[1]["name"], "u");
  EXPECT_EQ(c.messages[1].begin().key(), "role");  // key order kept
  EXPECT_TRUE(c.messages[2]["content"].is_null());
  EXPECT_TRUE(c.add_generation_prompt);
  EXPECT_EQ(c.completion.max_tokens, 5);
  EXPECT_TRUE(c.completion.stream && c.completion.include_usage);
  EXPECT_EQ(c.completion.stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(c.completion.prompt_text.empty() && c.completion.prompt_tokens.empty());
  EXPECT_FALSE(ChatOk(R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"add_generation_prompt":false})")
                   .add_generation_prompt);
#if KVSTREAM_PROTO_HAS_SAMPLING
  EXPECT_EQ(*ChatOk(R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":3})")
                 .completion.logprobs, 3);
  EXPECT_EQ(*ChatOk(R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"logprobs":true})")
                 .completion.logprobs, 0);
#endif
  EXPECT_FALSE(ChatOk(R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"logprobs":false})")
                   .completion.logprobs);

  struct Case {
    const char* body;
    const char* param;
  } cases[] = {
      {R"({"model":"tiny"})", "messages"},
      {R"({"model":"tiny","messages":[]})", "messages"},
      {R"({"model":"tiny","messages":"hi"})", "messages"},
      {R"({"model":"tiny","messages":[{"content":"x"}]})", "messages"},
      {R"({"model":"tiny","messages":[{"role":"user","content":7}]})", "messages"},
      {R"({"model":"tiny","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})", "messages"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"n":2})", "n"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", "tools"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"tool_choice":"auto"})", "tool_choice"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"functions":[{"name":"f"}]})", "functions"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}})", "response_format"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"logprobs":2})", "logprobs"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"top_logprobs":2})", "top_logprobs"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"max_tokens":0})", "max_tokens"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"prompt":"x"})", "prompt"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"suffix":"x"})", "suffix"},
  };
  for (const Case& c : cases) {
    const ApiError e = ChatErr(c.body);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_NE(e.message.find(c.param), std::string::npos) << c.body << ": " << e.message;
  }
  EXPECT_EQ(ChatErr(R"({"model":"gpt-4","messages":[{"role":"user","content":"x"}]})").code, "model_not_found");
  EXPECT_EQ(ChatErr("{bad").http_status, 400);
}

TEST(OpenAiChat, ChunksAndResponse) {
  ChatRequest c = ChatOk(R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"max_tokens":2,"return_token_ids":true})");
  CompletionBuilder b("chatcmpl-1", 1700000000, "tiny", c.completion, nullptr, /*chat=*/true);
  const std::string head = R"({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"tiny","choices":[)";
  EXPECT_EQ(b.FirstChunk(), head + R"({"delta":{"content":"","role":"assistant"},"finish_reason":null,"index":0,"logprobs":null}]})");
  EXPECT_EQ(b.Chunk(Msg(5, "He", false)),
            head + R"({"delta":{"content":"He","token_ids":[5]},"finish_reason":null,"index":0,"logprobs":null}]})");
  EXPECT_EQ(b.Chunk(Msg(6, "llo", true)),
            head + R"({"delta":{"content":"llo","token_ids":[6]},"finish_reason":null,"index":0,"logprobs":null}]})");
  EXPECT_EQ(b.FinishChunk(), head + R"({"delta":{},"finish_reason":"length","index":0,"logprobs":null}]})");
  EXPECT_EQ(b.UsageChunk(3), R"({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"tiny","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}})");
  b.set_prompt_token_ids({1, 2, 3});
  const json r = json::parse(b.Response(3));
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][0]["message"], json({{"role", "assistant"}, {"content", "Hello"}}));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["choices"][0]["token_ids"], json::array({5, 6}));
  EXPECT_EQ(r["prompt_token_ids"], json::array({1, 2, 3}));
  EXPECT_EQ(r["usage"]["total_tokens"], 5);
  // Completions have no first or finish chunk.
  CompletionBuilder t("cmpl-1", 1, "tiny", Ok(R"({"model":"tiny","prompt":"x"})"), nullptr);
  EXPECT_EQ(t.FirstChunk(), "");
  EXPECT_EQ(t.FinishChunk(), "");
#if KVSTREAM_PROTO_HAS_SAMPLING
  // logprobs in the chat shape: content[i] = {token, logprob, bytes, top_logprobs}.
  c = ChatOk(R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":1})");
  IdText names;
  CompletionBuilder l("chatcmpl-2", 1, "tiny", c.completion, &names, true);
  const json chunk = json::parse(l.Chunk(Msg(7, "a", true, -0.25f)));
  const json want = {{"token", "<7>"}, {"logprob", -0.25}, {"bytes", {60, 55, 62}},
                     {"top_logprobs", {{{"token", "<7>"}, {"logprob", -0.25}, {"bytes", {60, 55, 62}}}}}};
  EXPECT_EQ(chunk["choices"][0]["logprobs"]["content"][0], want);
  EXPECT_EQ(json::parse(l.Response(1))["choices"][0]["logprobs"]["content"], json::array({want}));
#endif
}

TEST(OpenAiProtocol, Models) {
  EXPECT_EQ(ModelsBody("tiny", 5),
            R"({"data":[{"created":5,"id":"tiny","object":"model","owned_by":"kvstream"}],"object":"list"})");
}

TEST(Sse, FramingByteForByte) {
  EXPECT_EQ(SseEvent(R"({"a":1})"), "data: {\"a\":1}\n\n");
  EXPECT_EQ(SseEvent("two\nlines"), "data: two\ndata: lines\n\n");
  EXPECT_EQ(SseEvent(""), "data: \n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
  EXPECT_EQ(HttpChunk("data: [DONE]\n\n"), "e\r\ndata: [DONE]\n\n\r\n");
  EXPECT_EQ(HttpChunk(std::string(300, 'x')), "12c\r\n" + std::string(300, 'x') + "\r\n");
  EXPECT_EQ(HttpChunk(""), "");
  EXPECT_EQ(kLastChunk, "0\r\n\r\n");
}

}  // namespace
}  // namespace kvstream::frontend
