// Runs the kvstream binary as a user would and checks its output against the library.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "model/cpu_backend.h"
#include "model/generate.h"

namespace kvstream {
namespace {

struct RunResult {
  int exit_code;
  std::string output;  // stdout and stderr
};

RunResult RunCli(const std::string& args) {
  std::string cmd = std::string(KVSTREAM_BIN) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::vector<int32_t> ExpectedTokens(const model::ModelSpec& spec, const std::vector<int32_t>& prompt,
                                    int n) {
  auto b = model::CreateCpuBackend(spec, model::BackendOptions{}).value();
  auto pool = b->CreatePool(16, 16).value();
  model::GenerateOptions o;
  o.max_new_tokens = n;
  return model::Generate(*b, *pool, prompt, o).value().tokens;
}

TEST(Cli, GenerateJsonMatchesLibrary) {
  auto r = RunCli("generate --model tiny --seed 3 --prompt-tokens 1,2,3 --max-new-tokens 6 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  model::ModelSpec spec;
  spec.seed = 3;
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), ExpectedTokens(spec, {1, 2, 3}, 6));
  EXPECT_EQ(j["decode_s"].size(), 5u);
  EXPECT_GT(j["ttft_s"].get<double>(), 0);
  EXPECT_EQ(j["backend"], "cpu");
  EXPECT_NE(j["config"].get<std::string>().find("LlamaForCausalLM"), std::string::npos) << j;
}

TEST(Cli, GenerateTextPrintsTimings) {
  auto r = RunCli("generate --prompt-len 20 --max-new-tokens 3 --layers 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tokens:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("TTFT"), std::string::npos);
  EXPECT_NE(r.output.find("per-token decode"), std::string::npos);
  EXPECT_NE(r.output.find("1 layers"), std::string::npos);
}

// generate --model DIR says what it understood of config.json before generating.
TEST(Cli, GeneratePrintsTheConfigItRead) {
  const std::string root = KVSTREAM_MODEL_GOLDENS;
  auto r = RunCli("generate --model " + root + "/llama31_llama3_tied_bf16 --prompt-tokens 1,2,3 "
                  "--max-new-tokens 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* words : {"LlamaForCausalLM", "rope llama3 theta=10000 factor=4",
                            "low_freq_factor=1 high_freq_factor=4",
                            "original_max_position_embeddings=32", "tied embeddings yes",
                            "dtype bf16", "head_dim 64", "context limit 128"})
    EXPECT_NE(r.output.find(words), std::string::npos) << words << "\n" << r.output;
}

TEST(Cli, CheckpointRoundTrip) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("kvstream_cli_ck_" + std::to_string(getpid()));
  fs::remove_all(dir);
  auto w = RunCli("make-checkpoint --model tiny --seed 5 --dtype bf16 --out " + dir.string());
  ASSERT_EQ(w.exit_code, 0) << w.output;
  EXPECT_TRUE(fs::exists(dir / "config.json"));
  EXPECT_TRUE(fs::exists(dir / "model.safetensors"));
  auto from_ck = RunCli("generate --model " + dir.string() + " --prompt-tokens 7,8,9,10 --max-new-tokens 5 --json");
  ASSERT_EQ(from_ck.exit_code, 0) << from_ck.output;
  auto dummy = RunCli("generate --model tiny --seed 5 --weight-dtype bf16 --prompt-tokens 7,8,9,10 "
                   "--max-new-tokens 5 --json");
  ASSERT_EQ(dummy.exit_code, 0) << dummy.output;
  auto a = nlohmann::json::parse(from_ck.output), b = nlohmann::json::parse(dummy.output);
  EXPECT_EQ(a["weight_dtype"], "bf16");  // from config.json's torch_dtype
  EXPECT_EQ(a["tokens"], b["tokens"]);
  // A truncated checkpoint is a clear error, not a crash.
  fs::resize_file(dir / "model.safetensors", fs::file_size(dir / "model.safetensors") / 2);
  auto bad = RunCli("generate --model " + dir.string() + " --prompt-tokens 1 --max-new-tokens 1");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("truncated"), std::string::npos) << bad.output;
  fs::remove_all(dir);
}

TEST(Cli, BadUsageIsAnErrorWithAMessage) {
  struct Case {
    std::string args, needle;
    int code;
  };
  for (const Case& c : {Case{"generate --prompt-tokens 1 --bogus 3", "unknown flag --bogus", 2},
                        Case{"generate --prompt-tokens 1,x", "bad token id 'x'", 2},
                        Case{"generate", "--prompt-tokens", 2},
                        Case{"generate --prompt-tokens 1 --max-new-tokens -1", "max-new-tokens", 2},
                        Case{"generate --prompt-tokens 99999", "out of the vocabulary", 2},
                        Case{"generate --prompt-tokens 1 --backend tpu", "--backend", 2},
                        Case{"generate --model nonexistent --prompt-tokens 1", "nonexistent", 1},
                        Case{"generate --prompt-tokens 1 --weight-dtype f8", "weight-dtype", 2},
                        Case{"generate --prompt-tokens", "needs a value", 2},
                        Case{"make-checkpoint --model tiny", "--out", 2},
                        Case{"frobnicate", "unknown command", 2}}) {
    auto r = RunCli(c.args);
    EXPECT_EQ(r.exit_code, c.code) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.needle), std::string::npos) << c.args << "\n" << r.output;
  }
}

TEST(Cli, PresetsAndHelp) {
  auto r = RunCli("presets");
  ASSERT_EQ(r.exit_code, 0);
  for (const char* n : {"tiny", "llama-2-7b", "llama-3-8b", "qwen2.5-7b", "131072"})
    EXPECT_NE(r.output.find(n), std::string::npos) << n;
  auto h = RunCli("help");
  EXPECT_EQ(h.exit_code, 0);
  EXPECT_NE(h.output.find("generate"), std::string::npos);
  auto gh = RunCli("generate --help");
  EXPECT_EQ(gh.exit_code, 0);
  EXPECT_NE(gh.output.find("--max-new-tokens"), std::string::npos);
}

}  // namespace
}  // namespace kvstream
