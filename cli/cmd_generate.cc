// kvstream generate: colocated prefill + decode (greedy, or sampled), printing tokens and timings.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/remote.h"
#include "cli/sampling_flags.h"
#include "common/time.h"
#include "model/generate.h"
#include "tokenizer/text_stream.h"
#include "model/generation_config.h"

namespace kvstream::cli {

int RunGenerate(std::span<const std::string> args) {
  if (WantsRemoteGenerate(args)) return RunRemoteGenerate(args);  // through the daemons
  std::vector<FlagSpec> specs = ModelFlagSpecs();
  for (auto& s : BackendFlagSpecs()) specs.push_back(s);
  for (auto& s : PromptFlagSpecs()) specs.push_back(s);
  specs.push_back({"prompt", true, "prompt text, encoded with the checkpoint's tokenizer; prints the text", ""});
  specs.push_back({"stop", true, "stop string: the text ends before it (needs the tokenizer)", ""});
  specs.push_back({"max-new-tokens", true, "tokens to generate", "8"});
  specs.push_back({"stop-token", true, "stop after generating this token id", ""});
  specs.push_back({"block-size", true, "KV block size in tokens", "16"});
  specs.push_back({"json", false, "print one JSON object instead of text", ""});
  for (auto& s : SamplingFlagSpecs()) specs.push_back(s);
  auto flags = Flags::Parse(args, specs);
  if (!flags.ok()) return ReportError("generate", flags.status(), true);
  if (flags->help()) {
    std::cout << "usage: kvstream generate [flags]\n\n" << FlagsHelp(specs);
    return kExitOk;
  }
  auto spec = ModelSpecFromFlags(*flags);
  if (!spec.ok()) return ReportError("generate", spec.status(), true);
  auto bopts = BackendOptionsFromFlags(*flags);
  if (!bopts.ok()) return ReportError("generate", bopts.status(), true);
  auto max_new = flags->GetInt("max-new-tokens", 1, 1 << 20);
  if (!max_new.ok()) return ReportError("generate", max_new.status(), true);
  auto block_size = flags->GetInt("block-size", 1, 1 << 16);
  if (!block_size.ok()) return ReportError("generate", block_size.status(), true);
  auto sampling = SamplingFromFlags(*flags);
  if (!sampling.ok()) return ReportError("generate", sampling.status(), true);
  model::GenerateOptions gopts;
  gopts.max_new_tokens = static_cast<int>(*max_new);
  gopts.sampling = sampling->params;
  if (flags->Has("stop-token")) {
    auto stop = flags->GetInt("stop-token", 0, INT32_MAX);
    if (!stop.ok()) return ReportError("generate", stop.status(), true);
    gopts.stop_token = static_cast<int32_t>(*stop);
  }
  const bool text_mode = flags->Has("prompt") || flags->Has("stop");
  if (flags->Has("prompt") && (flags->Has("prompt-tokens") || flags->Has("prompt-len")))
    return ReportError("generate", InvalidArgument("give --prompt or --prompt-tokens/--prompt-len, not both"), true);
  if (!flags->Has("prompt") && !flags->Has("prompt-tokens") && !flags->Has("prompt-len"))
    return ReportError("generate", InvalidArgument("give --prompt, --prompt-tokens or --prompt-len"), true);
  std::unique_ptr<tokenizer::Tokenizer> tok;
  if (text_mode) {
    auto t = tokenizer::Tokenizer::ForModel(spec->model);
    if (!t.ok()) return ReportError("generate", t.status().WithContext("--prompt/--stop need the tokenizer"), false);
    tok = std::move(t).value();
  }

  const auto load_start = Clock::now();
  auto backend = model::CreateBackend(*spec, *bopts);
  if (!backend.ok()) return ReportError("generate", backend.status().WithContext("loading model"), false);
  const double load_s = SecondsSince(load_start);
  const model::ModelConfig& cfg = (*backend)->config();
  if (!sampling->ignore_eos) {
    auto defaults = model::LoadGenerationDefaults(spec->model, cfg.vocab_size);
    if (!defaults.ok()) return ReportError("generate", defaults.status(), false);
    gopts.stop_tokens = defaults->eos_token_ids;
  }
  auto prompt = flags->Has("prompt") ? tok->Encode(flags->Get("prompt")) : PromptFromFlags(*flags, cfg.vocab_size, spec->seed);
  if (!prompt.ok()) return ReportError("generate", prompt.status(), !flags->Has("prompt"));
  for (const int32_t t : *prompt) {
    if (t >= cfg.vocab_size)
      return ReportError("generate", InvalidArgument("the tokenizer gave id " + std::to_string(t) + ", past the model's vocabulary of " + std::to_string(cfg.vocab_size)), false);
  }
  const int bs = static_cast<int>(*block_size);
  const int blocks = model::BlocksForTokens(int(prompt->size()) + gopts.max_new_tokens, bs);
  auto pool = (*backend)->CreatePool(blocks, bs);
  if (!pool.ok()) return ReportError("generate", pool.status(), false);
  auto r = model::Generate(**backend, **pool, *prompt, gopts);
  if (!r.ok()) return ReportError("generate", r.status(), false);
  // The text, streamed as a server would; a stop string cuts the text and the tokens after it.
  std::string text, stop_string;
  if (tok) {
    tokenizer::TextStream ts(*tok, flags->Has("stop") ? std::vector<std::string>{flags->Get("stop")}
                                                      : std::vector<std::string>{});
    for (size_t i = 0; i < r->tokens.size(); ++i) {
      auto step = ts.Push(r->tokens[i], i + 1 == r->tokens.size());
      if (!step.ok()) return ReportError("generate", step.status().WithContext("decoding text"), false);
      text += step->text;
      if (!step->stop_string.empty()) {
        stop_string = step->stop_string;
        r->tokens.resize(i + 1);
        break;
      }
    }
  }

  const double decode_sum = std::accumulate(r->decode_seconds.begin(), r->decode_seconds.end(), 0.0);
  const double decode_mean = r->decode_seconds.empty() ? 0 : decode_sum / r->decode_seconds.size();
  if (flags->Has("json")) {
    nlohmann::ordered_json j;
    j["model"] = cfg.name;
    j["config"] = model::DescribeConfig(cfg);
    j["layers"] = cfg.num_layers;
    j["backend"] = (*backend)->name();
    j["weight_dtype"] = DTypeName(cfg.weight_dtype);
    j["kv_dtype"] = DTypeName(cfg.kv_dtype);
    j["model_hash"] = cfg.hash();
    j["prompt_tokens"] = prompt->size();
    j["tokens"] = r->tokens;
    if (tok) {
      j["text"] = text;
      j["stop_string"] = stop_string;
    }
    j["load_s"] = load_s;
    j["prefill_s"] = r->prefill_seconds;
    j["ttft_s"] = r->ttft_seconds;
    j["decode_s"] = r->decode_seconds;
    j["decode_mean_s"] = decode_mean;
    j["total_s"] = r->total_seconds;
    j["stopped"] = r->stopped;
    if (!gopts.sampling.greedy()) j["sample_seed"] = gopts.sampling.seed;
    if (!r->logprobs.empty()) {
      nlohmann::ordered_json lps = nlohmann::ordered_json::array();
      for (size_t i = 0; i < r->logprobs.size(); ++i)
        lps.push_back(LogprobsJson(r->tokens[i], r->logprobs[i]));
      j["logprobs"] = lps;
    }
    std::cout << j.dump() << "\n";
    return kExitOk;
  }
  // What the config was understood as: architecture, rope type and parameters, tied
  // embeddings, dtype, head_dim, context limit.
  std::printf("model %s: %s\n", cfg.name.c_str(), model::DescribeConfig(cfg).c_str());
  std::printf("backend %s, weights %s, kv %s; loaded in %.3f s\n", (*backend)->name().c_str(),
              std::string(DTypeName(cfg.weight_dtype)).c_str(),
              std::string(DTypeName(cfg.kv_dtype)).c_str(), load_s);
  std::printf("prompt: %zu tokens\n", prompt->size());
  if (tok) std::printf("%s\n", text.c_str());
  std::printf("tokens:");
  for (int32_t t : r->tokens) std::printf(" %d", t);
  std::printf("%s\n", !stop_string.empty() ? ("  (stop string \"" + stop_string + "\")").c_str()
                                            : r->stopped ? "  (stop token)" : "");
  if (!r->logprobs.empty()) {
    std::printf("logprobs:");
    for (const auto& lp : r->logprobs) std::printf(" %.4f", lp.logprob);
    std::printf("\n");
  }
  std::printf("prefill: %.3f ms   TTFT: %.3f ms\n", r->prefill_seconds * 1e3, r->ttft_seconds * 1e3);
  std::printf("per-token decode (ms):");
  for (double d : r->decode_seconds) std::printf(" %.3f", d * 1e3);
  std::printf("\n");
  if (!r->decode_seconds.empty())
    std::printf("decode mean: %.3f ms/token (%.1f tokens/s)   total: %.3f ms\n", decode_mean * 1e3,
                1.0 / decode_mean, r->total_seconds * 1e3);
  return kExitOk;
}

}  // namespace kvstream::cli
