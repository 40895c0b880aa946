// kvstream generate --decode HOST:PORT: generation through the daemons, streaming tokens.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/remote.h"
#include "cli/sampling_flags.h"
#include "common/time.h"

#if KVSTREAM_CLI_HAVE_DAEMONS
#include <grpcpp/grpcpp.h>

#include "connector/grpc_status.h"
#include "proto/kvstream.grpc.pb.h"
#endif

namespace kvstream::cli {

bool WantsRemoteGenerate(std::span<const std::string> args) {
  for (const auto& a : args)
    if (a == "--decode" || a.rfind("--decode=", 0) == 0) return true;
  return false;
}

#if KVSTREAM_CLI_HAVE_DAEMONS
namespace v1 = kvstream::v1;

Result<v1::LoadMode> ParseLoadMode(const std::string& s) {
  if (s == "default") return v1::LOAD_MODE_DEFAULT;
  if (s == "pipelined") return v1::LOAD_MODE_PIPELINED;
  if (s == "non-pipelined") return v1::LOAD_MODE_NON_PIPELINED;
  if (s == "local") return v1::LOAD_MODE_LOCAL;
  return InvalidArgument("--mode: expected default, pipelined, non-pipelined or local, got '" + s + "'");
}

int RunRemoteGenerate(std::span<const std::string> args) {
  std::vector<FlagSpec> specs = PromptFlagSpecs();
  specs.push_back({"decode", true, "decode daemon address HOST:PORT", ""});
  specs.push_back({"prompt", true, "prompt text, encoded by the daemon's tokenizer; prints the text", ""});
  specs.push_back({"stop", true, "stop string: generation ends when the text contains it", ""});
  specs.push_back({"max-new-tokens", true, "tokens to generate", "8"});
  specs.push_back({"stop-token", true, "stop after generating this token id", ""});
  specs.push_back({"mode", true, "KV load: default, pipelined, non-pipelined or local", "default"});
  specs.push_back({"seed", true, "seed of --prompt-len prompts", "0"});
  specs.push_back({"deadline-ms", true, "deadline of the whole call", "60000"});
  specs.push_back({"json", false, "print one JSON object instead of text", ""});
  for (auto& s : AuthFlagSpecs()) specs.push_back(s);
  for (auto& s : SamplingFlagSpecs()) specs.push_back(s);
  auto flags = Flags::Parse(args, specs);
  if (!flags.ok()) return ReportError("generate", flags.status(), true);
  if (flags->help()) {
    std::cout << "usage: kvstream generate --decode HOST:PORT [flags]\n\n" << FlagsHelp(specs);
    return kExitOk;
  }
  auto max_new = flags->GetInt("max-new-tokens", 1, 1 << 20);
  if (!max_new.ok()) return ReportError("generate", max_new.status(), true);
  auto deadline_ms = flags->GetInt("deadline-ms", 1, int64_t(1) << 40);
  if (!deadline_ms.ok()) return ReportError("generate", deadline_ms.status(), true);
  auto seed = flags->GetInt("seed", 0, INT64_MAX);
  if (!seed.ok()) return ReportError("generate", seed.status(), true);
  auto mode = ParseLoadMode(flags->Get("mode"));
  if (!mode.ok()) return ReportError("generate", mode.status(), true);
  auto sampling = SamplingFromFlags(*flags);
  if (!sampling.ok()) return ReportError("generate", sampling.status(), true);

  auto channel = RemoteChannel(*flags, flags->Get("decode"));
  if (!channel.ok()) return ReportError("generate", channel.status(), true);
  auto stub = v1::Decode::NewStub(*channel);
  // The vocabulary bounds --prompt-len ids; Stats also proves the daemon is there.
  v1::StatsResponse stats;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Status s = stub->Stats(&ctx, v1::StatsRequest(), &stats);
    if (!s.ok())
      return ReportError("generate", connector::FromGrpc(s).WithContext("decode " + flags->Get("decode")), false);
  }
  if (stats.vocab_size() <= 0)
    return ReportError("generate", FailedPrecondition("decode daemon reports no vocabulary size (older daemon?)"), false);
  const bool text_mode = flags->Has("prompt") || flags->Has("stop");
  Result<std::vector<int32_t>> prompt = std::vector<int32_t>{};
  if (flags->Has("prompt")) {
    if (flags->Has("prompt-tokens") || flags->Has("prompt-len"))
      return ReportError("generate", InvalidArgument("give --prompt or --prompt-tokens/--prompt-len, not both"), true);
  } else {
    prompt = PromptFromFlags(*flags, stats.vocab_size(), static_cast<uint64_t>(*seed));
    if (!prompt.ok()) return ReportError("generate", prompt.status(), true);
  }

  v1::GenerateRequest req;
  *req.mutable_prompt_tokens() = {prompt->begin(), prompt->end()};
  if (flags->Has("prompt")) req.set_prompt_text(flags->Get("prompt"));
  if (flags->Has("stop")) req.add_stop_strings(flags->Get("stop"));
  req.set_max_tokens(static_cast<int>(*max_new));
  req.set_load_mode(*mode);
  SetRequestSampling(*sampling, &req);
  if (flags->Has("stop-token")) {
    auto stop = flags->GetInt("stop-token", 0, INT32_MAX);
    if (!stop.ok()) return ReportError("generate", stop.status(), true);
    req.add_stop_token_ids(static_cast<int32_t>(*stop));
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(*deadline_ms));
  const bool json = flags->Has("json");
  auto start = Clock::now();
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse msg;
  std::vector<int32_t> tokens;
  std::vector<double> arrival_s;
  v1::LoadInfo load;
  uint64_t request_id = 0, sample_seed = 0;
  std::string text, stop_string;
  nlohmann::ordered_json logprobs = nlohmann::ordered_json::array();
  if (!json && !text_mode) std::printf("prompt: %zu tokens\ntokens:", prompt->size());
  while (reader->Read(&msg)) {
    arrival_s.push_back(SecondsSince(start));
    tokens.push_back(msg.token_id());
    request_id = msg.request_id();
    if (msg.has_load()) load = msg.load();
    text += msg.text();
    if (!msg.stop_string().empty()) stop_string = msg.stop_string();
    if (tokens.size() == 1) sample_seed = msg.seed();
    if (msg.has_logprob()) logprobs.push_back(LogprobsJson(msg.token_id(), ResponseLogprobs(msg)));
    if (!json) {
      if (text_mode) std::fwrite(msg.text().data(), 1, msg.text().size(), stdout);
      else std::printf(" %d", msg.token_id());
      std::fflush(stdout);
    }
  }
  grpc::Status st = reader->Finish();
  if (!json) std::printf("\n");
  if (!json && text_mode && st.ok()) {
    std::printf("tokens:");
    for (int32_t t : tokens) std::printf(" %d", t);
    std::printf("%s\n", stop_string.empty() ? "" : ("  (stop string \"" + stop_string + "\")").c_str());
  }
  if (!st.ok()) return ReportError("generate", connector::FromGrpc(st), false);
  const double ttft = arrival_s.empty() ? 0 : arrival_s.front();
  const double total = SecondsSince(start);
  if (json) {
    nlohmann::ordered_json j;
    j["decode"] = flags->Get("decode");
    j["request_id"] = request_id;
    j["model"] = stats.model_name();
    if (!flags->Has("prompt")) j["prompt_tokens"] = prompt->size();
    j["tokens"] = tokens;
    j["text"] = text;
    j["stop_string"] = stop_string;
    j["ttft_s"] = ttft;
    j["total_s"] = total;
    j["loaded_remotely"] = load.loaded_remotely();
    j["pipelined"] = load.pipelined();
    j["recomputed"] = load.recomputed();
    j["kv_bytes"] = load.kv_bytes();
    j["prefill_compute_us"] = load.prefill_compute_us();
    j["transfer_us"] = load.transfer_us();
    j["load_wait_us"] = load.load_wait_us();
    if (!sampling->params.greedy()) j["sample_seed"] = sample_seed;
    if (!logprobs.empty()) j["logprobs"] = logprobs;
    std::cout << j.dump() << "\n";
  } else {
    if (!logprobs.empty()) {
      std::printf("logprobs:");
      for (const auto& e : logprobs) std::printf(" %.4f", e["logprob"].get<double>());
      std::printf("\n");
    }
    if (!sampling->params.greedy())
      std::printf("sample seed: %llu\n", static_cast<unsigned long long>(sample_seed));
    std::printf("request %llu on %s (%s): TTFT %.3f ms, total %.3f ms, %s\n",
                static_cast<unsigned long long>(request_id), flags->Get("decode").c_str(),
                stats.model_name().c_str(), ttft * 1e3, total * 1e3,
                load.loaded_remotely()
                    ? (std::string(load.pipelined() ? "pipelined" : "non-pipelined") +
                       " load of " + std::to_string(load.kv_bytes()) + " KV bytes")
                          .c_str()
                    : (load.recomputed() ? "load failed, recomputed locally" : "computed locally"));
  }
  return kExitOk;
}
#else
int RunRemoteGenerate(std::span<const std::string> args) {
  return ReportError("generate", NotSupported("this kvstream was built without the daemons' "
                                              "client (KVSTREAM_WITH_DAEMONS=OFF)"), false);
}
#endif

}  // namespace kvstream::cli
