// kvstream make-checkpoint: writes a Hugging Face-format directory (config.json +
// model.safetensors) holding a preset's dummy weights, for testing checkpoint loading.
#include <filesystem>
#include <iostream>

#include "cli/commands.h"
#include "cli/flags.h"
#include "model/weights.h"

namespace kvstream::cli {

int RunMakeCheckpoint(std::span<const std::string> args) {
  std::vector<FlagSpec> specs = {
      {"model", true, "preset to take shapes and dummy weights from", "tiny"},
      {"layers", true, "keep only the first N layers (0 = all)", "0"},
      {"seed", true, "dummy-weight seed", "0"},
      {"dtype", true, "tensor dtype in the file: f32, f16 or bf16", "bf16"},
      {"out", true, "output directory (created)", ""},
  };
  auto flags = Flags::Parse(args, specs);
  if (!flags.ok()) return ReportError("make-checkpoint", flags.status(), true);
  if (flags->help()) {
    std::cout << "usage: kvstream make-checkpoint --out DIR [flags]\n\n" << FlagsHelp(specs);
    return kExitOk;
  }
  if (!flags->Has("out")) return ReportError("make-checkpoint", InvalidArgument("--out is required"), true);
  auto dtype = flags->GetDType("dtype");
  if (!dtype.ok()) return ReportError("make-checkpoint", dtype.status(), true);
  auto layers = flags->GetInt("layers", 0, 1 << 16);
  if (!layers.ok()) return ReportError("make-checkpoint", layers.status(), true);
  auto seed = flags->GetInt("seed", 0, INT64_MAX);
  if (!seed.ok()) return ReportError("make-checkpoint", seed.status(), true);
  model::ModelSpec spec;
  spec.model = flags->Get("model");
  spec.seed = static_cast<uint64_t>(*seed);
  spec.num_layers_override = static_cast<int>(*layers);
  spec.weight_dtype = *dtype;  // dummy values rounded to the file's dtype
  auto w = model::OpenWeights(spec);
  if (!w.ok()) return ReportError("make-checkpoint", w.status(), false);
  if (!(*w)->is_dummy())
    return ReportError("make-checkpoint", InvalidArgument("--model must be a preset"), true);
  const std::string out = flags->Get("out");
  Status s = model::WriteHfCheckpoint(**w, *dtype, out);
  if (!s.ok()) return ReportError("make-checkpoint", s, false);
  std::error_code ec;
  auto bytes = std::filesystem::file_size(std::filesystem::path(out) / "model.safetensors", ec);
  std::cout << "wrote " << out << ": " << (*w)->config().name << ", "
            << (*w)->config().num_layers << " layers, " << (*w)->config().num_parameters()
            << " parameters, " << DTypeName(*dtype) << ", " << bytes << " bytes\n";
  return kExitOk;
}

}  // namespace kvstream::cli
