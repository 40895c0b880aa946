// The chat template API: loading from a checkpoint folder, rendering role/content messages,
// errors that name the construct, and the bounds on hostile templates. Byte-for-byte equality
// with Jinja2 is chat_template_jinja2_test's (check_vs_jinja2.py).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "frontend/chat_template.h"

namespace kvstream::frontend {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string Render(const std::string& src, const std::vector<ChatMessage>& msgs, bool agp = true) {
  auto t = CompileChatTemplate(src);
  if (!t.ok()) return "compile: " + t.status().ToString();
  std::vector<std::pair<std::string, std::string>> special = {{"bos_token", "<s>"},
                                                              {"eos_token", "</s>"}};
  auto r = RenderChat(*t, msgs, agp, &special);
  return r.ok() ? *r : r.status().ToString();
}

class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("kvstream_ct_" + std::to_string(getpid()))) {
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string Write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
    return (path_ / name).string();
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

TEST(ChatTemplate, RendersLlama3ForRoleContentMessages) {
  const std::string src = ReadFile(std::string(KVSTREAM_CHAT_TEMPLATES) + "/llama3.jinja");
  const std::string out = Render(src, {{"system", " Be brief. ", {}}, {"user", "Hi\n", {}}});
  EXPECT_EQ(out,
            "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, ExtraMessageKeysReachTheTemplate) {
  ChatMessage m{"assistant", "", nlohmann::ordered_json::parse(
                                     R"({"tool_calls": [{"function": {"name": "f", "arguments": {"b": 1, "a": [true, null, 1.5]}}}]})")};
  EXPECT_EQ(Render("{{ messages[0].tool_calls[0].function.arguments | tojson }}", {m}),
            R"({"b": 1, "a": [true, null, 1.5]})");
}

TEST(ChatTemplate, LoadsFromTokenizerConfigWithSpecialTokens) {
  TempDir dir;
  dir.Write("tokenizer_config.json", R"({
    "bos_token": {"content": "<|begin|>", "lstrip": false},
    "eos_token": "<|end|>",
    "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}"
  })");
  auto t = LoadChatTemplate(dir.path());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto r = RenderChat(*t, {{"user", "x", {}}}, false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "<|begin|>x<|end|>");
  // The file itself works as the path too.
  EXPECT_TRUE(LoadChatTemplate(dir.path() + "/tokenizer_config.json").ok());
}

TEST(ChatTemplate, NamedTemplatesAndChatTemplateJinjaFile) {
  TempDir dir;
  dir.Write("tokenizer_config.json", R"({"chat_template": [
    {"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]})");
  auto d = LoadChatTemplate(dir.path());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(RenderChat(*d, {}, false).value(), "D");
  auto t = LoadChatTemplate(dir.path(), "tool_use");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(RenderChat(*t, {}, false).value(), "T");
  auto missing = LoadChatTemplate(dir.path(), "rag");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("tool_use"), std::string::npos);
  dir.Write("chat_template.jinja", "J\n");  // transformers 4.4x+ saves it beside the config
  auto j = LoadChatTemplate(dir.path());
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_EQ(RenderChat(*j, {}, false).value(), "J");
}

TEST(ChatTemplate, MissingOrMalformedConfigIsAClearError) {
  TempDir dir;
  EXPECT_EQ(LoadChatTemplate(dir.path()).status().code(), StatusCode::kNotFound);
  dir.Write("tokenizer_config.json", "{\"chat_template\": 5}");
  EXPECT_EQ(LoadChatTemplate(dir.path()).status().code(), StatusCode::kInvalidArgument);
  dir.Write("tokenizer_config.json", "{not json");
  EXPECT_EQ(LoadChatTemplate(dir.path()).status().code(), StatusCode::kInvalidArgument);
  dir.Write("tokenizer_config.json", "{\"chat_template\": \"x\", \"bos_token\": 3}");
  EXPECT_EQ(LoadChatTemplate(dir.path()).status().code(), StatusCode::kInvalidArgument);
}

TEST(ChatTemplate, UnsupportedConstructsAreNamed) {
  struct Case {
    const char* src;
    const char* named;
  };
  for (const Case& c : {Case{"{{ 'a' | urlize }}", "the filter 'urlize'"},
                        Case{"{% include 'x' %}", "the 'include' tag"},
                        Case{"{% raw %}x{% endraw %}", "the raw tag"},
                        Case{"{{ '%s' % 1 }}", "string % formatting"},
                        Case{"{{ 'x' is divisible(2) }}", "the test 'divisible'"},
                        Case{"{{ 'a'.format(1) }}", "the str method 'format'"},
                        Case{"{% for x in [1] recursive %}{% endfor %}", "recursive for loops"},
                        Case{"{{ 'É' | lower }}", "lower of non-ASCII text"},
                        Case{"{% for x in [1] %}{{ loop.cycle('a') }}{% endfor %}", "loop.cycle"}}) {
    auto t = CompileChatTemplate(c.src);
    Status st = t.status();
    if (t.ok()) st = RenderChat(*t, {}, false).status();
    EXPECT_EQ(st.code(), StatusCode::kNotSupported) << c.src << ": " << st.ToString();
    EXPECT_NE(st.message().find(c.named), std::string::npos) << c.src << ": " << st.ToString();
  }
}

TEST(ChatTemplate, SyntaxAndRuntimeErrorsSayWhere) {
  auto t = CompileChatTemplate("line one\n{% if x %}\nno end");
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("endif"), std::string::npos) << t.status().ToString();
  auto u = CompileChatTemplate("a\nb\n{{ x + }}");
  EXPECT_NE(u.status().message().find("line 3"), std::string::npos) << u.status().ToString();
  const std::string raised =
      Render("{{ raise_exception('roles must alternate') }}", {{"user", "x", {}}});
  EXPECT_NE(raised.find("INVALID_ARGUMENT"), std::string::npos) << raised;
  EXPECT_NE(raised.find("roles must alternate"), std::string::npos) << raised;
  const std::string undefined_attr = Render("{{ nothing.here }}", {});
  EXPECT_NE(undefined_attr.find("'nothing' is undefined"), std::string::npos) << undefined_attr;
}

TEST(ChatTemplate, HostileTemplatesFailWithinBounds) {
  for (const std::string& src :
       {std::string("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}"
                    "{% endfor %}"),
        std::string("{{ 'x' * 1000000000 }}"),
        std::string("{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                    "{% set ns.s = ns.s + ns.s %}{% endfor %}"),
        std::string("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}"),
        "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}",
        std::string(2 << 20, 'x')}) {
    auto t = CompileChatTemplate(src);
    Status st = t.status();
    if (t.ok()) st = RenderChat(*t, {}, false).status();
    EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << src.substr(0, 80) << ": " << st.ToString();
  }
}

TEST(ChatTemplate, ScopesFollowJinja) {
  // A loop body's assignments do not outlive the iteration; a namespace carries state out.
  EXPECT_EQ(Render("{% set x = 0 %}{% for i in [1, 2] %}{{ x }}{% set x = x + i %}{{ x }};"
                   "{% endfor %}{{ x }}",
                   {}),
            "01;02;0");
  EXPECT_EQ(Render("{% set ns = namespace(n=0) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}"
                   "{% endfor %}{{ ns.n }}",
                   {}),
            "6");
  EXPECT_EQ(Render("{% if true %}{% set y = 5 %}{% endif %}{{ y }}", {}), "5");
}

}  // namespace
}  // namespace kvstream::frontend
