// Renders chat template requests for check_vs_jinja2.py: one JSON object per input line
// ({"template", "messages", "tools", "variables", "add_generation_prompt", "special_tokens"}),
// one answer per output line ({"ok": true, "text"} or {"ok": false, "code", "error"}).
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "frontend/chat_template.h"

int main() {
  using nlohmann::ordered_json;
  std::string line;
  while (std::getline(std::cin, line)) {
    ordered_json out;
    const auto req = ordered_json::parse(line);
    auto tmpl = kvstream::frontend::CompileChatTemplate(req["template"].get<std::string>());
    kvstream::Result<std::string> text = tmpl.status();
    if (tmpl.ok()) {
      const auto& special = req["special_tokens"];
      for (auto it = special.begin(); it != special.end(); ++it)
        tmpl->special_tokens.emplace_back(it.key(), it.value().get<std::string>());
      kvstream::frontend::ChatRenderOptions opt;
      opt.add_generation_prompt = req["add_generation_prompt"].get<bool>();
      opt.tools = req["tools"];
      opt.variables = req["variables"];
      text = kvstream::frontend::RenderChatJson(*tmpl, req["messages"], opt);
    }
    if (text.ok()) {
      out["ok"] = true;
      out["text"] = *text;
    } else {
      out["ok"] = false;
      out["code"] = std::string(kvstream::StatusCodeName(text.status().code()));
      out["error"] = text.status().message();
    }
    std::cout << out.dump(-1, ' ', false, ordered_json::error_handler_t::replace) << "\n";
  }
  return 0;
}
