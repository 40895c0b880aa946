#include "frontend/openai_protocol.h"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

namespace kvstream::frontend {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

ApiError Bad(std::string message, std::string param) {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param), ""};
}

json NullIfEmpty(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

bool IsInt(const ojson& v) { return v.is_number_integer() || v.is_number_unsigned(); }

// A JSON integer within [lo, hi] (a float with an integral value is accepted, as OpenAI does).
std::optional<int64_t> IntIn(const ojson& v, int64_t lo, int64_t hi) {
  double d;
  if (IsInt(v)) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      return std::nullopt;
    const int64_t i = v.get<int64_t>();
    return i >= lo && i <= hi ? std::optional<int64_t>(i) : std::nullopt;
  }
  if (!v.is_number_float()) return std::nullopt;
  d = v.get<double>();
  if (!std::isfinite(d) || d != std::floor(d) || d < double(lo) || d > double(hi)) return std::nullopt;
  return int64_t(d);
}

// Fields kvstream accepts only at their no-op value (what a client sends by default).
bool IsNoOp(const std::string& key, const ojson& v) {
  if (v.is_null()) return true;
  if (key == "n" || key == "best_of") return IntIn(v, 1, 1).has_value();
  if (key == "echo") return v.is_boolean() && !v.get<bool>();
  if (key == "presence_penalty" || key == "frequency_penalty")
    return v.is_number() && v.get<double>() == 0.0;
  if (key == "repetition_penalty") return v.is_number() && v.get<double>() == 1.0;
  if (key == "logit_bias") return v.is_object() && v.empty();
  if (key == "suffix") return v.is_string() && v.get<std::string>().empty();
  if (key == "min_tokens") return IntIn(v, 0, 0).has_value();
  if (key == "skip_special_tokens") return v.is_boolean() && v.get<bool>();
  return false;
}

std::optional<ApiError> ParsePrompt(const ojson& p, CompletionRequest* out) {
  auto tokens = [&](const ojson& a) -> std::optional<ApiError> {
    if (a.empty()) return Bad("prompt is an empty list of token ids", "prompt");
    for (const ojson& t : a) {
      auto id = IntIn(t, 0, std::numeric_limits<int32_t>::max());
      if (!id) return Bad("prompt: token ids are integers >= 0", "prompt");
      out->prompt_tokens.push_back(int32_t(*id));
    }
    return std::nullopt;
  };
  if (p.is_string()) {
    out->prompt_text = p.get<std::string>();
    if (out->prompt_text.empty()) return Bad("prompt is empty", "prompt");
    return std::nullopt;
  }
  if (!p.is_array() || p.empty())
    return Bad("prompt must be a string, a list of token ids, or a list of one of them", "prompt");
  if (p.front().is_number()) return tokens(p);
  if (p.size() > 1)
    return Bad("prompt: one prompt per request (a list of " + std::to_string(p.size()) +
                   " prompts is not supported; send them as separate requests)", "prompt");
  if (p.front().is_string()) return ParsePrompt(p.front(), out);
  if (p.front().is_array()) return tokens(p.front());
  return Bad("prompt must be a string, a list of token ids, or a list of one of them", "prompt");
}

std::optional<ApiError> Number(const ojson& v, const char* key, std::optional<double>* out) {
  if (v.is_null()) return std::nullopt;
  if (!v.is_number()) return Bad(std::string(key) + " must be a number", key);
  *out = v.get<double>();
  return std::nullopt;
}

}  // namespace

std::string ErrorBody(const ApiError& e) {
  json j = {{"error",
             {{"message", e.message}, {"type", e.type}, {"param", NullIfEmpty(e.param)},
              {"code", NullIfEmpty(e.code)}}}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

ApiError ErrorFromStatus(const Status& s) {
  const std::string m = s.message();
  switch (s.code()) {
    case StatusCode::kInvalidArgument: return {400, m, "invalid_request_error", "", ""};
    case StatusCode::kNotFound: return {404, m, "invalid_request_error", "", ""};
    case StatusCode::kResourceExhausted:
      if (m.find("admission queue full") != std::string::npos)
        return {429, m, "server_overloaded", "", "queue_full"};
      return {503, m, "server_overloaded", "", "kv_pool_full"};
    case StatusCode::kUnavailable: return {503, m, "service_unavailable", "", ""};
    case StatusCode::kTimeout: return {504, m, "timeout", "", ""};
    case StatusCode::kCanceled: return {499, m, "canceled", "", ""};
    default: return {500, s.ToString(), "server_error", "", ""};
  }
}

namespace {

// The body as a JSON object naming the served model (key order kept, as Python's json.loads).
std::variant<ojson, ApiError> ParseBody(std::string_view body, const std::string& model_id) {
  ojson j = ojson::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad("the body is not valid JSON", "");
  if (!j.is_object()) return Bad("the body must be a JSON object", "");
  if (!j.contains("model") || !j["model"].is_string())
    return Bad("model is required (a string: GET /v1/models lists it)", "model");
  if (j["model"].get<std::string>() != model_id)
    return ApiError{404, "The model '" + j["model"].get<std::string>() + "' does not exist (this server serves '" + model_id + "')",
                    "invalid_request_error", "model", "model_not_found"};
  return j;
}

// A field both APIs share, parsed into *r: true when `k` is one of them (*e set when it is bad).
bool CommonField(const std::string& k, const ojson& v, CompletionRequest* r, std::optional<ApiError>* e) {
  if (k == "model" || k == "user") return true;
  if (k == "cache_salt") {  // vLLM's: the KV cache's per-tenant salt
    if (!v.is_string() || v.get<std::string>().empty() || v.get<std::string>().size() > 256)
      *e = Bad("cache_salt must be a non-empty string of at most 256 bytes", k);
    else r->cache_salt = v.get<std::string>();
    return true;
  }
  if (v.is_null() && k != "stream" && k != "ignore_eos" && k != "return_token_ids") {
    return k == "max_tokens" || k == "stream_options" || k == "stop" || k == "temperature" ||
           k == "top_p" || k == "min_p" || k == "top_k" || k == "seed" || k == "load_mode";
  }
  if (k == "max_tokens") {
    auto n = IntIn(v, 1, std::numeric_limits<int32_t>::max());
    if (!n) *e = Bad("max_tokens must be an integer >= 1 (at most the context less the prompt)", k);
    else r->max_tokens = int(*n);
  } else if (k == "stream" || k == "ignore_eos" || k == "return_token_ids") {
    if (!v.is_boolean()) *e = Bad(k + " must be a boolean", k);
    else (k == "stream" ? r->stream : k == "ignore_eos" ? r->ignore_eos : r->return_token_ids) = v.get<bool>();
  } else if (k == "stream_options") {
    if (!v.is_object()) *e = Bad("stream_options must be an object", k);
    for (auto o = v.begin(); !*e && o != v.end(); ++o) {
      if (o.key() != "include_usage" || !o.value().is_boolean())
        *e = Bad("stream_options: only include_usage (a boolean) is supported", k);
      else r->include_usage = o.value().get<bool>();
    }
  } else if (k == "stop") {
    if (v.is_string()) {
      r->stop.push_back(v.get<std::string>());
    } else if (v.is_array() && v.size() <= 16) {
      for (const ojson& s : v) {
        if (!s.is_string()) {
          *e = Bad("stop must be a string or a list of strings", k);
          return true;
        }
        r->stop.push_back(s.get<std::string>());
      }
    } else {
      *e = Bad("stop must be a string or a list of at most 16 strings", k);
    }
  } else if (k == "temperature") {
    *e = Number(v, "temperature", &r->temperature);
  } else if (k == "top_p") {
    *e = Number(v, "top_p", &r->top_p);
  } else if (k == "min_p") {
    *e = Number(v, "min_p", &r->min_p);
  } else if (k == "top_k") {
    auto n = IntIn(v, -1, std::numeric_limits<int32_t>::max());
    if (!n) *e = Bad("top_k must be an integer >= -1 (-1 or 0: off)", k);
    else r->top_k = *n < 0 ? 0 : int(*n);
  } else if (k == "load_mode") {
    const std::string m = v.is_string() ? v.get<std::string>() : "";
    if (m == "default") r->load_mode = kvstream::v1::LOAD_MODE_DEFAULT;
    else if (m == "pipelined") r->load_mode = kvstream::v1::LOAD_MODE_PIPELINED;
    else if (m == "non-pipelined") r->load_mode = kvstream::v1::LOAD_MODE_NON_PIPELINED;
    else if (m == "local") r->load_mode = kvstream::v1::LOAD_MODE_LOCAL;
    else *e = Bad("load_mode must be \"default\", \"pipelined\", \"non-pipelined\" or \"local\"", k);
  } else if (k == "seed") {
    if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0)) r->seed = v.get<uint64_t>();
    else *e = Bad("seed must be an integer >= 0", k);
  } else {
    return false;
  }
  return true;
}

// Fields both APIs accept only at their no-op value (completions also suffix).
bool IsNoOpField(const std::string& k) {
  return k == "n" || k == "best_of" || k == "echo" || k == "presence_penalty" ||
         k == "frequency_penalty" || k == "repetition_penalty" || k == "logit_bias" ||
         k == "min_tokens" || k == "skip_special_tokens";
}

// Fields kvstream implements only at their no-op value: any other value is a 400 naming it.
std::optional<ApiError> NoOpOnly(const std::string& k, const ojson& v) {
  if (IsNoOp(k, v)) return std::nullopt;
  return Bad(k + " = " + v.dump() + " is not supported by kvstream (docs/http.md lists what is)", k);
}

std::optional<ApiError> FinalChecks(const CompletionRequest& r) {
  if (r.temperature && *r.temperature < 0) return Bad("temperature must be >= 0", "temperature");
#if !KVSTREAM_PROTO_HAS_SAMPLING
  // Until sampling is in the API (issue 17): greedy only, and greedy is the default.
  const char* sampled = r.temperature && *r.temperature > 0 ? "temperature"
                        : r.top_p && *r.top_p < 1           ? "top_p"
                        : r.top_k > 0                       ? "top_k"
                        : r.min_p && *r.min_p > 0           ? "min_p"
                        : r.logprobs                        ? "logprobs"
                                                            : nullptr;
  if (sampled != nullptr)
    return Bad(std::string(sampled) + ": this build decodes greedily only (sampling is not in it yet)", sampled);
#endif
  return std::nullopt;
}

// messages: a non-empty list of objects with a string role and a string, null or text-parts
// content (joined with "\n"); other keys go to the template as they are.
std::optional<ApiError> ParseMessages(const ojson& v, ojson* out) {
  if (!v.is_array() || v.empty()) return Bad("messages must be a non-empty list of messages", "messages");
  *out = ojson::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = "messages[" + std::to_string(i) + "]";
    const ojson& m = v[i];
    if (!m.is_object()) return Bad(at + " must be an object", "messages");
    if (!m.contains("role") || !m["role"].is_string() || m["role"].get<std::string>().empty())
      return Bad(at + ".role must be a non-empty string", "messages");
    ojson msg = m;
    if (m.contains("content") && m["content"].is_array()) {
      std::string text;
      for (size_t p = 0; p < m["content"].size(); ++p) {
        const ojson& part = m["content"][p];
        const std::string pat = at + ".content[" + std::to_string(p) + "]";
        if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
          return Bad(pat + " must be an object with a type", "messages");
        if (part["type"] != "text")
          return Bad(pat + ".type " + part["type"].dump() + " is not supported (text parts only)", "messages");
        if (!part.contains("text") || !part["text"].is_string())
          return Bad(pat + ".text must be a string", "messages");
        text += (p == 0 ? "" : "\n") + part["text"].get<std::string>();
      }
      msg["content"] = text;
    } else if (m.contains("content") && !m["content"].is_string() && !m["content"].is_null()) {
      return Bad(at + ".content must be a string, a list of text parts or null", "messages");
    }
    out->push_back(std::move(msg));
  }
  return std::nullopt;
}

// Chat fields about tools and output formats: accepted only when they ask for nothing.
bool IsChatNoOp(const std::string& k, const ojson& v) {
  if (v.is_null()) return true;
  if (k == "tools" || k == "functions") return v.is_array() && v.empty();
  if (k == "tool_choice" || k == "function_call") return v == "none";
  if (k == "parallel_tool_calls") return v.is_boolean();
  if (k == "response_format") return v.is_object() && v.size() == 1 && v.value("type", "") == "text";
  return false;
}

}  // namespace

std::variant<CompletionRequest, ApiError> ParseCompletionRequest(std::string_view body,
                                                                 const std::string& model_id) {
  auto parsed = ParseBody(body, model_id);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const ojson& j = std::get<ojson>(parsed);
  CompletionRequest r;
  if (!j.contains("prompt")) return Bad("prompt is required", "prompt");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const ojson& v = it.value();
    std::optional<ApiError> e;
    if (CommonField(k, v, &r, &e)) {
    } else if (k == "prompt") {
      e = ParsePrompt(v, &r);
    } else if (k == "logprobs") {
      if (v.is_null()) continue;
      auto n = IntIn(v, 0, 20);
      if (!n) return Bad("logprobs must be an integer in [0, 20]", k);
      r.logprobs = int(*n);
    } else if (IsNoOpField(k) || k == "suffix") {
      e = NoOpOnly(k, v);
    } else {
      return Bad("unknown parameter " + k + " (docs/http.md lists the supported ones)", k);
    }
    if (e) return *e;
  }
  if (auto e = FinalChecks(r)) return *e;
  return r;
}

std::variant<ChatRequest, ApiError> ParseChatRequest(std::string_view body,
                                                     const std::string& model_id) {
  auto parsed = ParseBody(body, model_id);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const ojson& j = std::get<ojson>(parsed);
  ChatRequest c;
  CompletionRequest& r = c.completion;
  if (!j.contains("messages")) return Bad("messages is required", "messages");
  bool logprobs = false;
  std::optional<int> top_logprobs;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const ojson& v = it.value();
    std::optional<ApiError> e;
    if (CommonField(k == "max_completion_tokens" ? "max_tokens" : k, v, &r, &e)) {
    } else if (k == "messages") {
      e = ParseMessages(v, &c.messages);
    } else if (k == "logprobs") {
      if (!v.is_null() && !v.is_boolean()) return Bad("logprobs must be a boolean", k);
      logprobs = v.is_boolean() && v.get<bool>();
    } else if (k == "top_logprobs") {
      if (v.is_null()) continue;
      auto n = IntIn(v, 0, 20);
      if (!n) return Bad("top_logprobs must be an integer in [0, 20]", k);
      top_logprobs = int(*n);
    } else if (k == "add_generation_prompt") {
      if (!v.is_boolean()) return Bad("add_generation_prompt must be a boolean", k);
      c.add_generation_prompt = v.get<bool>();
    } else if (k == "tools" || k == "tool_choice" || k == "functions" || k == "function_call" ||
               k == "parallel_tool_calls" || k == "response_format") {
      if (!IsChatNoOp(k, v))
        return Bad(k + " is not supported by kvstream (no tool calling or structured output; docs/http.md)", k);
    } else if (IsNoOpField(k)) {
      e = NoOpOnly(k, v);
    } else {
      return Bad("unknown parameter " + k + " (docs/http.md lists the supported ones)", k);
    }
    if (e) return *e;
  }
  if (top_logprobs && !logprobs) return Bad("top_logprobs needs logprobs: true", "top_logprobs");
  if (logprobs) r.logprobs = top_logprobs.value_or(0);
  if (auto e = FinalChecks(r)) return *e;
  return c;
}

kvstream::v1::GenerateRequest ToGenerateRequest(const CompletionRequest& c) {
  kvstream::v1::GenerateRequest g;
  if (c.prompt_text.empty()) {
    *g.mutable_prompt_tokens() = {c.prompt_tokens.begin(), c.prompt_tokens.end()};
  } else {
    g.set_prompt_text(c.prompt_text);
  }
  g.set_max_tokens(c.max_tokens);
  g.set_load_mode(c.load_mode);
  g.set_cache_salt(c.cache_salt);
  for (const std::string& s : c.stop) g.add_stop_strings(s);
#if KVSTREAM_PROTO_HAS_SAMPLING
  g.set_ignore_eos(c.ignore_eos);
  kvstream::v1::SamplingParams* s = g.mutable_sampling();
  // OpenAI's default temperature is 1; 0 is greedy.
  s->set_temperature(float(c.temperature.value_or(1.0)));
  s->set_top_k(c.top_k);
  if (c.top_p) s->set_top_p(float(*c.top_p));
  if (c.min_p) s->set_min_p(float(*c.min_p));
  if (c.seed) s->set_seed(*c.seed);
  if (c.logprobs) {
    s->set_logprobs(true);
    s->set_top_logprobs(*c.logprobs);
  }
#endif
  return g;
}

std::string FinishReason(const kvstream::v1::GenerateResponse& last, int generated, int max_tokens) {
  if (!last.stop_string().empty()) return "stop";
  return generated >= max_tokens ? "length" : "stop";
}

CompletionBuilder::CompletionBuilder(std::string id, int64_t created, std::string model,
                                     const CompletionRequest& req, const TokenText* token_text,
                                     bool chat)
    : id_(std::move(id)), model_(std::move(model)), created_(created), chat_(chat), req_(req),
      token_text_(token_text) {}

std::string CompletionBuilder::Head(bool chunk) const {
  const char* object = !chat_ ? "text_completion" : chunk ? "chat.completion.chunk" : "chat.completion";
  return R"({"id":)" + json(id_).dump() + R"(,"object":")" + object + R"(","created":)" +
         std::to_string(created_) + R"(,"model":)" + json(model_).dump();
}

std::string CompletionBuilder::ChatChoice(const json& delta, const json& logprobs,
                                          const std::string& finish) const {
  json choice = {{"index", 0}, {"delta", delta}, {"logprobs", logprobs},
                 {"finish_reason", NullIfEmpty(finish)}};
  return Head(true) + R"(,"choices":[)" + choice.dump(-1, ' ', false, json::error_handler_t::replace) + "]}";
}

// Chat's logprobs entry of token i: {"token","logprob","bytes","top_logprobs":[...]}.
json CompletionBuilder::ChatLogprob(size_t i) const {
  auto entry = [](const std::string& tok, double v) {
    json bytes = json::array();
    for (const unsigned char ch : tok) bytes.push_back(int(ch));
    return json{{"token", tok}, {"logprob", std::isnan(v) ? json(nullptr) : json(v)}, {"bytes", bytes}};
  };
  json e = entry(lp_tokens_[i], lp_values_[i]);
  e["top_logprobs"] = json::array();
  for (const auto& [s, v] : lp_top_[i]) e["top_logprobs"].push_back(entry(s, v));
  return e;
}

std::string CompletionBuilder::FirstChunk() const {
  if (!chat_) return "";
  return ChatChoice({{"role", "assistant"}, {"content", ""}}, nullptr, "");
}

std::string CompletionBuilder::FinishChunk() const {
  if (!chat_) return "";
  return ChatChoice(json::object(), nullptr, finish_);
}

std::string CompletionBuilder::Chunk(const kvstream::v1::GenerateResponse& msg) {
  tokens_.push_back(msg.token_id());
  const size_t offset = text_.size();
  text_ += msg.text();
  if (msg.last()) finish_ = FinishReason(msg, generated(), req_.max_tokens);
  json lp = nullptr;
#if KVSTREAM_PROTO_HAS_SAMPLING
  if (req_.logprobs) {
    const std::string tok = token_text_ ? token_text_->Text(msg.token_id())
                                        : "token_id:" + std::to_string(msg.token_id());
    json top = json::object();
    std::vector<std::pair<std::string, double>> tops;
    for (const auto& t : msg.top_logprobs()) {
      const std::string s = token_text_ ? token_text_->Text(t.token_id())
                                        : "token_id:" + std::to_string(t.token_id());
      tops.emplace_back(s, t.logprob());
      if (!top.contains(s)) top[s] = t.logprob();
    }
    lp = json::object();
    lp["tokens"] = json::array({tok});
    lp["token_logprobs"] = json::array({msg.has_logprob() ? json(msg.logprob()) : json(nullptr)});
    lp["top_logprobs"] = json::array({top});
    lp["text_offset"] = json::array({offset});
    lp_tokens_.push_back(tok);
    lp_values_.push_back(msg.has_logprob() ? msg.logprob() : std::nan(""));
    lp_top_.push_back(std::move(tops));
    lp_offsets_.push_back(offset);
    if (chat_) lp = json{{"content", json::array({ChatLogprob(lp_tokens_.size() - 1)})}};
  }
#endif
  if (chat_) {
    json delta = {{"content", msg.text()}};
    if (req_.return_token_ids) delta["token_ids"] = json::array({msg.token_id()});
    return ChatChoice(delta, lp, "");
  }
  json choice = {{"index", 0}, {"text", msg.text()}, {"logprobs", lp},
                 {"finish_reason", NullIfEmpty(msg.last() ? finish_ : "")}};
  if (req_.return_token_ids) choice["token_ids"] = json::array({msg.token_id()});
  return Head(true) + R"(,"choices":[)" + choice.dump(-1, ' ', false, json::error_handler_t::replace) + "]}";
}

std::string CompletionBuilder::UsageChunk(int prompt_tokens) const {
  return Head(true) + R"(,"choices":[],"usage":{"prompt_tokens":)" + std::to_string(prompt_tokens) +
         R"(,"completion_tokens":)" + std::to_string(generated()) + R"(,"total_tokens":)" +
         std::to_string(prompt_tokens + generated()) + "}}";
}

std::string CompletionBuilder::Response(int prompt_tokens) const {
  json lp = nullptr;
  if (req_.logprobs && chat_) {
    lp = json{{"content", json::array()}};
    for (size_t i = 0; i < lp_tokens_.size(); ++i) lp["content"].push_back(ChatLogprob(i));
  } else if (req_.logprobs) {
    json values = json::array(), tops = json::array();
    for (double v : lp_values_) values.push_back(std::isnan(v) ? json(nullptr) : json(v));
    for (const auto& t : lp_top_) {
      json o = json::object();
      for (const auto& [s, v] : t)
        if (!o.contains(s)) o[s] = v;
      tops.push_back(o);
    }
    lp = json::object();
    lp["tokens"] = lp_tokens_;
    lp["token_logprobs"] = values;
    lp["top_logprobs"] = tops;
    lp["text_offset"] = lp_offsets_;
  }
  json choice = {{"index", 0}, {"logprobs", lp}, {"finish_reason", NullIfEmpty(finish_)}};
  if (chat_) choice["message"] = {{"role", "assistant"}, {"content", text_}};
  else choice["text"] = text_;
  if (req_.return_token_ids) choice["token_ids"] = tokens_;
  json usage = {{"prompt_tokens", prompt_tokens}, {"completion_tokens", generated()},
                {"total_tokens", prompt_tokens + generated()}};
  std::string out = Head(false) + R"(,"choices":[)" +
                    choice.dump(-1, ' ', false, json::error_handler_t::replace) + R"(],"usage":)" + usage.dump();
  if (req_.return_token_ids && chat_) out += R"(,"prompt_token_ids":)" + json(prompt_ids_).dump();
  return out + "}";
}

std::string ModelsBody(const std::string& model_id, int64_t created) {
  json model = {{"id", model_id}, {"object", "model"}, {"created", created}, {"owned_by", "kvstream"}};
  json j = {{"object", "list"}, {"data", json::array({model})}};
  return j.dump();
}

}  // namespace kvstream::frontend
