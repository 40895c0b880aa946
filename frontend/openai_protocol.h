// OpenAI's completions and chat completions APIs as JSON (docs/http.md): the request parsed and
// checked into a GenerateRequest (chat: the messages for the chat template), the responses and
// server-sent-event chunks built from GenerateResponses, and errors in OpenAI's shape. Pure (no
// I/O, no server state): unit-tested on its own.
//
// Guarantees:
//  - A body is accepted only when every field is known and of the right type; a field kvstream
//    does not implement (n > 1, echo, logit_bias, penalties, ...) is a 400 naming it, never
//    ignored. The only model accepted is the one served (else 404, code model_not_found).
//  - ErrorBody is {"error":{"message","type","param","code"}} (param and code null when empty).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "proto/kvstream.pb.h"

namespace kvstream::frontend {

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
};
std::string ErrorBody(const ApiError& e);
// A Status of the decode server as an HTTP error: kInvalidArgument 400, kUnauthenticated 401,
// kNotFound 404, kResourceExhausted 429 when the admission queue is full and 503 when the pool
// stayed full past the queue timeout, kUnavailable 503, kTimeout 504, kCanceled 499, else 500.
ApiError ErrorFromStatus(const Status& s);

struct CompletionRequest {
  std::vector<int32_t> prompt_tokens;  // one of prompt_tokens / prompt_text
  std::string prompt_text;
  int max_tokens = 16;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
  std::vector<std::string> stop;
  std::optional<double> temperature, top_p, min_p;
  int top_k = 0;
  std::optional<uint64_t> seed;
  std::optional<int> logprobs;  // top-N log-probabilities per token (0: the chosen one only)
  bool ignore_eos = false;
  std::string cache_salt;  // GenerateRequest.cache_salt
  bool return_token_ids = false;  // vLLM's extension: choices[0].token_ids
  // kvstream's extension "load_mode": how the prompt's KV is made (gRPC's LoadMode):
  // "pipelined", "non-pipelined", "local" (the decode computes it: colocated) or "default".
  kvstream::v1::LoadMode load_mode = kvstream::v1::LOAD_MODE_DEFAULT;
};

// Parses a POST /v1/completions body; `model_id` is the one model served.
std::variant<CompletionRequest, ApiError> ParseCompletionRequest(std::string_view body,
                                                                 const std::string& model_id);
// A POST /v1/chat/completions body: the sampling and output fields as a completion's (prompt
// empty: the chat template renders `messages`), tools and response formats refused (400 naming
// the field). `messages` keeps each message's keys in order, its content a string (a list of
// {"type":"text"} parts joined with "\n", as vLLM does for string-content templates) or null.
struct ChatRequest {
  CompletionRequest completion;
  nlohmann::ordered_json messages;
  bool add_generation_prompt = true;  // vLLM's extension; OpenAI's behaviour is true
};
std::variant<ChatRequest, ApiError> ParseChatRequest(std::string_view body,
                                                     const std::string& model_id);

// The gRPC request the completion asks for.
kvstream::v1::GenerateRequest ToGenerateRequest(const CompletionRequest& req);

// Why a completion ended: "stop" (a stop string or token), "length" (max_tokens reached).
std::string FinishReason(const kvstream::v1::GenerateResponse& last, int generated, int max_tokens);

// The completion's text and log-probabilities as they build up, message by message, in the
// completions shape (text_completion) or the chat shape (chat.completion, chat.completion.chunk
// with a first chunk carrying the role and a last one carrying finish_reason). `token_text`
// gives a token's text for logprobs (may be empty: ids shown as "token_id:N").
struct TokenText {
  virtual ~TokenText() = default;
  virtual std::string Text(int32_t id) const = 0;
};
class CompletionBuilder {
 public:
  CompletionBuilder(std::string id, int64_t created, std::string model, const CompletionRequest& req,
                    const TokenText* token_text, bool chat = false);
  // The stream's first chunk (chat: the assistant role), or "" (completions).
  std::string FirstChunk() const;
  // Adds one message; returns the SSE chunk object for it (stream mode).
  std::string Chunk(const kvstream::v1::GenerateResponse& msg);
  // The chunk after the last message (chat: finish_reason), or "" (completions: it was on the last).
  std::string FinishChunk() const;
  // The prompt as encoded, returned with return_token_ids (chat: "prompt_token_ids").
  void set_prompt_token_ids(std::vector<int32_t> ids) { prompt_ids_ = std::move(ids); }
  // The stream's last chunk with usage (stream_options.include_usage).
  std::string UsageChunk(int prompt_tokens) const;
  // The whole non-streamed response.
  std::string Response(int prompt_tokens) const;
  int generated() const { return static_cast<int>(tokens_.size()); }

 private:
  std::string Head(bool chunk) const;
  std::string ChatChoice(const nlohmann::json& delta, const nlohmann::json& logprobs,
                         const std::string& finish) const;
  nlohmann::json ChatLogprob(size_t i) const;
  const std::string id_, model_;
  const int64_t created_;
  const bool chat_;
  std::vector<int32_t> prompt_ids_;
  const CompletionRequest req_;
  const TokenText* token_text_;
  std::vector<int32_t> tokens_;
  std::string text_, finish_;
  // logprobs (when asked): the legacy completions shape.
  std::vector<std::string> lp_tokens_;
  std::vector<double> lp_values_;
  std::vector<std::vector<std::pair<std::string, double>>> lp_top_;
  std::vector<size_t> lp_offsets_;
};

// GET /v1/models.
std::string ModelsBody(const std::string& model_id, int64_t created);

}  // namespace kvstream::frontend
