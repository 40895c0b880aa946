#include "frontend/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "frontend/jinja_eval.h"
#include "frontend/jinja_parser.h"

namespace kvstream::frontend {
namespace {

using jinja::TemplateError;

Status FromError(const TemplateError& e) {
  const std::string what = std::string("chat template: ") + e.what();
  switch (e.kind()) {
    case TemplateError::Kind::kUnsupported: return NotSupported(what);
    case TemplateError::Kind::kLimit: return ResourceExhausted(what);
    case TemplateError::Kind::kRaised:
      return InvalidArgument(std::string("chat template raised an exception: ") + e.what());
    default: return InvalidArgument(what);
  }
}

Result<std::string> ReadFile(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return NotFound("cannot read " + p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Result<nlohmann::ordered_json> ReadJson(const std::filesystem::path& p) {
  KV_ASSIGN_OR_RETURN(std::string text, ReadFile(p));
  auto j = nlohmann::ordered_json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument(p.string() + ": not a JSON object");
  return j;
}

// tokenizer_config.json's chat_template: a string, or [{"name", "template"}, ...].
Result<std::string> PickTemplate(const nlohmann::ordered_json& t, const std::string& name,
                                 const std::string& where) {
  if (t.is_string()) {
    if (!name.empty() && name != "default")
      return NotFound(where + " has a single chat template, not one named '" + name + "'");
    return t.get<std::string>();
  }
  if (!t.is_array()) return InvalidArgument(where + ": chat_template is neither a string nor a list");
  const std::string want = name.empty() ? "default" : name;
  std::string names;
  for (const auto& e : t) {
    if (!e.is_object() || !e.contains("name") || !e.contains("template") ||
        !e["name"].is_string() || !e["template"].is_string())
      return InvalidArgument(where + ": a chat_template entry lacks a string name or template");
    if (e["name"] == want) return e["template"].get<std::string>();
    names += (names.empty() ? "" : ", ") + e["name"].get<std::string>();
  }
  return NotFound(where + ": no chat template named '" + want + "' (it has: " + names + ")");
}

jinja::Value Message(const ChatMessage& m) {
  auto d = std::make_shared<jinja::Dict>();
  d->Set("role", jinja::Value::Str(m.role));
  d->Set("content", jinja::Value::Str(m.content));
  if (m.extra.is_object())
    for (auto it = m.extra.begin(); it != m.extra.end(); ++it)
      d->Set(it.key(), jinja::FromJson(it.value()));
  return jinja::Value::MakeDict(std::move(d));
}

Result<std::string> Render(const ChatTemplate& tmpl, jinja::Value messages,
                           const ChatRenderOptions& options,
                           const std::vector<std::pair<std::string, std::string>>& special) {
  if (!tmpl.parsed) return FailedPrecondition("chat template: not compiled");
  try {
    auto globals = std::make_shared<jinja::Dict>();
    for (const auto& [k, v] : special) globals->Set(k, jinja::Value::Str(v));
    if (options.variables.is_object())
      for (auto it = options.variables.begin(); it != options.variables.end(); ++it)
        globals->Set(it.key(), jinja::FromJson(it.value()));
    else if (!options.variables.is_null())
      return InvalidArgument("chat template: variables must be a JSON object");
    globals->Set("messages", std::move(messages));
    globals->Set("tools", jinja::FromJson(options.tools));
    globals->Set("documents", jinja::FromJson(options.documents));
    globals->Set("add_generation_prompt", jinja::Value::Bool(options.add_generation_prompt));
    jinja::Renderer r(*tmpl.parsed, std::move(globals), jinja::RenderLimits{});
    return r.Render();
  } catch (const TemplateError& e) {
    return FromError(e);
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("chat template: out of memory while rendering");
  }
}

}  // namespace

Result<ChatTemplate> CompileChatTemplate(const std::string& source) {
  try {
    ChatTemplate t;
    t.source = source;
    t.parsed = std::make_shared<const jinja::Body>(jinja::Parse(source));
    return t;
  } catch (const TemplateError& e) {
    return FromError(e);
  }
}

Result<ChatTemplate> LoadChatTemplate(const std::string& path, const std::string& name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool is_dir = fs::is_directory(path, ec);
  const fs::path dir = is_dir ? fs::path(path) : fs::path(path).parent_path();
  const fs::path config = is_dir ? dir / "tokenizer_config.json" : fs::path(path);
  nlohmann::ordered_json cfg = nlohmann::ordered_json::object();
  if (fs::exists(config, ec)) {
    KV_ASSIGN_OR_RETURN(cfg, ReadJson(config));
  } else if (!is_dir) {
    return NotFound("no file " + config.string());
  }
  std::string source;
  bool found = false;
  if (fs::exists(dir / "chat_template.jinja", ec) && (name.empty() || name == "default")) {
    KV_ASSIGN_OR_RETURN(source, ReadFile(dir / "chat_template.jinja"));
    found = true;
  } else if (cfg.contains("chat_template") && !cfg["chat_template"].is_null()) {
    KV_ASSIGN_OR_RETURN(source, PickTemplate(cfg["chat_template"], name, config.string()));
    found = true;
  } else if (fs::exists(dir / "chat_template.json", ec)) {
    KV_ASSIGN_OR_RETURN(auto j, ReadJson(dir / "chat_template.json"));
    if (j.contains("chat_template")) {
      KV_ASSIGN_OR_RETURN(source, PickTemplate(j["chat_template"], name,
                                               (dir / "chat_template.json").string()));
      found = true;
    }
  }
  if (!found) return NotFound("no chat template in " + path);
  KV_ASSIGN_OR_RETURN(ChatTemplate t, CompileChatTemplate(source));
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                          "cls_token", "mask_token"}) {
    if (!cfg.contains(key) || cfg[key].is_null()) continue;
    const auto& v = cfg[key];
    if (v.is_string()) {
      t.special_tokens.emplace_back(key, v.get<std::string>());
    } else if (v.is_object() && v.contains("content") && v["content"].is_string()) {
      t.special_tokens.emplace_back(key, v["content"].get<std::string>());
    } else {
      return InvalidArgument(config.string() + ": " + key + " is neither a string nor an object "
                             "with a string content");
    }
  }
  return t;
}

Result<std::string> RenderChatJson(const ChatTemplate& tmpl, const nlohmann::ordered_json& messages,
                                   const ChatRenderOptions& options) {
  if (!messages.is_array()) return InvalidArgument("chat template: messages must be a JSON array");
  try {
    return Render(tmpl, jinja::FromJson(messages), options, tmpl.special_tokens);
  } catch (const TemplateError& e) {
    return FromError(e);
  }
}

Result<std::string> RenderChat(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                               bool add_generation_prompt,
                               const std::vector<std::pair<std::string, std::string>>* special) {
  try {
    jinja::List list;
    for (const ChatMessage& m : messages) list.push_back(Message(m));
    ChatRenderOptions options;
    options.add_generation_prompt = add_generation_prompt;
    return Render(tmpl, jinja::Value::MakeList(std::move(list)), options,
                  special ? *special : tmpl.special_tokens);
  } catch (const TemplateError& e) {
    return FromError(e);
  }
}

}  // namespace kvstream::frontend
