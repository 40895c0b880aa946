// kvstream presets: the built-in model shapes.
#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "cli/flags.h"
#include "model/config.h"

namespace kvstream::cli {

int RunPresets(std::span<const std::string> args) {
  std::vector<FlagSpec> specs;
  auto flags = Flags::Parse(args, specs);
  if (!flags.ok()) return ReportError("presets", flags.status(), true);
  if (flags->help()) {
    std::cout << "usage: kvstream presets\n";
    return kExitOk;
  }
  std::printf("%-12s %6s %6s %9s %5s %6s %7s %9s %10s %8s %14s\n", "preset", "layers", "hidden",
              "heads/kv", "head", "mlp", "vocab", "rope", "params", "qkv_bias", "KV B/token f16");
  for (const auto& name : model::PresetNames()) {
    auto c = model::PresetConfig(name).value();
    char heads[32];
    std::snprintf(heads, sizeof heads, "%d/%d", c.num_heads, c.num_kv_heads);
    std::printf("%-12s %6d %6d %9s %5d %6d %7d %9.0f %9.3fB %8s %14llu\n", name.c_str(), c.num_layers,
                c.hidden_size, heads, c.head_dim, c.intermediate_size, c.vocab_size, c.rope_theta,
                c.num_parameters() / 1e9, c.qkv_bias ? "yes" : "no",
                static_cast<unsigned long long>(c.kv_bytes_per_token()));
  }
  return kExitOk;
}

}  // namespace kvstream::cli
