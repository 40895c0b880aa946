// Chat templates: a checkpoint's `chat_template` (tokenizer_config.json, or chat_template.jinja
// beside it) rendered as Hugging Face transformers' apply_chat_template(tokenize=False) renders
// it: Jinja2 with trim_blocks and lstrip_blocks, loopcontrols, HF's tojson, raise_exception and
// strftime_now, and the variables messages, tools (None), documents (None),
// add_generation_prompt and the tokenizer's special tokens (bos_token, eos_token, ...).
//
// Guarantees:
//  - The output equals Python Jinja2's byte for byte for what the engine implements
//    (tests/frontend: real templates of Llama 2/3/3.1, Mistral, Qwen2/2.5, Gemma, ChatML).
//  - A construct the engine does not implement is an error naming it (NOT_SUPPORTED), never a
//    different prompt; a syntax error, a runtime error (undefined value used, type error) or the
//    template's own raise_exception(...) is INVALID_ARGUMENT with the message; a template that
//    exceeds the work or size bounds is RESOURCE_EXHAUSTED. All of them are the client's 400.
//  - Nothing aborts the process; rendering is bounded (steps, output bytes, nesting).
//  - A ChatTemplate is immutable after loading: any number of threads may render with it.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace kvstream::frontend {

namespace jinja {
struct Stmt;
}

struct ChatTemplate {
  std::string source;
  // The tokenizer's special tokens as tokenizer_config.json names them (bos_token, eos_token,
  // unk_token, pad_token, ...), in that file's order; absent ones are undefined in the template.
  std::vector<std::pair<std::string, std::string>> special_tokens;
  std::shared_ptr<const std::vector<std::unique_ptr<jinja::Stmt>>> parsed;
};

struct ChatMessage {
  std::string role;
  std::string content;
  // Further keys of the message as the template sees them (name, tool_calls, tool_call_id, ...),
  // a JSON object or null; a "content" key here replaces `content` (e.g. a list of parts).
  nlohmann::ordered_json extra;
};

// Parses `source`; INVALID_ARGUMENT / NOT_SUPPORTED naming the line and construct.
Result<ChatTemplate> CompileChatTemplate(const std::string& source);

// Reads the chat template of a checkpoint: `path` is a folder (tokenizer_config.json, or
// chat_template.jinja / chat_template.json beside it) or a tokenizer_config.json file. A list
// of named templates picks `name` ("default" when empty). The special tokens come from
// tokenizer_config.json (strings or {"content": ...} objects). NOT_FOUND when there is no
// template; INVALID_ARGUMENT for malformed files.
Result<ChatTemplate> LoadChatTemplate(const std::string& path, const std::string& name = "");

struct ChatRenderOptions {
  bool add_generation_prompt = false;
  nlohmann::ordered_json tools;      // null: the template sees tools = None
  nlohmann::ordered_json documents;  // null: documents = None
  nlohmann::ordered_json variables;  // an object of further variables (e.g. date_string) or null
};

// The prompt text for `messages` (a JSON array of objects, their key order kept).
Result<std::string> RenderChatJson(const ChatTemplate& tmpl, const nlohmann::ordered_json& messages,
                                   const ChatRenderOptions& options);

// The same for role/content messages; `special_tokens` replaces tmpl.special_tokens when given.
Result<std::string> RenderChat(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                               bool add_generation_prompt,
                               const std::vector<std::pair<std::string, std::string>>*
                                   special_tokens = nullptr);

}  // namespace kvstream::frontend
