// Fuzzes the chat template engine (frontend/chat_template.h): the input is a template source,
// compiled and, when it compiles, rendered with a fixed conversation, with and without the
// generation prompt. Any input must end in a text or a Status: never a crash, a hang past
// libFuzzer's -timeout, or an INTERNAL error.
#include <cstdint>
#include <string>
#include <vector>

#include "frontend/chat_template.h"
#include "tests/fuzz/fuzz_util.h"

using kvstream::StatusCode;
using kvstream::frontend::ChatMessage;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string src(reinterpret_cast<const char*>(data), size);
  auto tmpl = kvstream::frontend::CompileChatTemplate(src);
  if (!tmpl.ok()) {
    if (tmpl.status().code() == StatusCode::kInternal)
      kvstream::fuzz::Fail("compile: " + tmpl.status().ToString());
    return 0;
  }
  tmpl->special_tokens = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  const std::vector<ChatMessage> msgs = {
      {"system", "Be brief.", {}},
      {"user", "Hi {{ x }} \xc3\xa9", {}},
      {"assistant", "", nlohmann::ordered_json::parse(
                            R"({"tool_calls": [{"id": "abcdefghi", "function": {"name": "f", "arguments": {"a": 1.5}}}]})")},
      {"tool", "{\"ok\": true}", nullptr}};
  for (bool agp : {false, true}) {
    auto out = kvstream::frontend::RenderChat(*tmpl, msgs, agp);
    if (!out.ok() && out.status().code() == StatusCode::kInternal)
      kvstream::fuzz::Fail("render: " + out.status().ToString());
  }
  return 0;
}
