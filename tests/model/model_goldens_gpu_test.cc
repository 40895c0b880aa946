// The CUDA backend on the model goldens (tests/data/model_goldens; the CPU test,
// model_goldens_test, checks the CPU backend equals the reference on every token).
// Teacher-forced on the reference's tokens: each step's GPU logits against the CPU backend's
// (float32 KV) within cuda_backend_test's tolerance (6e-2 bf16, 1.5e-2 f16, of the largest
// |logit|), and the GPU's greedy token equal to the reference's wherever the reference's top-2
// margin exceeds twice that step's measured logit error (then no rounding can flip it); the
// other steps are printed as skipped, with the numbers. f32 checkpoints are skipped: the CUDA
// backend runs f16/bf16 weights.
#include <gtest/gtest.h>

#include <cstdio>

#include "model/cpu_backend.h"
#include "model/cuda/cuda_backend.h"
#include "tests/model/golden_util.h"

namespace kvstream::model {
namespace {

TEST(ModelGoldensGpu, TokensEqualWhereTheMarginExceedsTheError) {
  int compared = 0, skipped = 0;
  for (const std::string& name : golden::GoldenCases()) {
    SCOPED_TRACE(name);
    const golden::Golden g = golden::LoadGolden(name);
    auto cfg = ConfigFromHfJson(golden::ReadFile(g.dir + "/config.json"));
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    if (cfg->weight_dtype == DType::kF32) {
      std::printf("skip %s: f32 weights (the CUDA backend runs f16/bf16 weights)\n", name.c_str());
      continue;
    }
    ModelSpec spec;
    spec.model = g.dir;
    spec.weight_dtype = cfg->weight_dtype;
    spec.kv_dtype = DType::kF32;
    auto cpu = CreateCpuBackend(spec, BackendOptions{});
    ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
    spec.kv_dtype = cfg->weight_dtype;
    BackendOptions gopt;
    gopt.kind = "cuda";
    auto gpu = CreateCudaBackend(spec, gopt);
    ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
    std::vector<std::vector<float>> a, b;
    ASSERT_TRUE(golden::TeacherForced(**cpu, g, &a).ok());
    ASSERT_TRUE(golden::TeacherForced(**gpu, g, &b).ok());
    const double tol = cfg->weight_dtype == DType::kBF16 ? 6e-2 : 1.5e-2;
    double worst = 0;
    for (size_t step = 0; step < g.tokens.size(); ++step) {
      double scale = 0;
      for (float v : a[step]) scale = std::max(scale, std::fabs(double(v)));
      const double err = golden::MaxAbsDiff(a[step], b[step]);
      worst = std::max(worst, err / scale);
      EXPECT_LE(err / scale, tol) << "step " << step;
      const double margin = g.margins_f32[step];
      if (margin > 2 * err) {
        EXPECT_EQ(golden::Argmax(b[step]), g.tokens[step]) << "step " << step;
        ++compared;
      } else {
        ++skipped;
        std::printf("skip %s step %zu: reference top-2 margin %.3g <= 2 x GPU logit error %.3g "
                    "(GPU token %d, reference %d)\n",
                    name.c_str(), step, margin, err, golden::Argmax(b[step]), g.tokens[step]);
      }
    }
    std::printf("%-38s %s %s: max logit error %.3g of max |logit| (tolerance %.3g)\n",
                name.c_str(), cfg->rope.type.c_str(), g.dtype.c_str(), worst, tol);
  }
  std::printf("GPU golden steps: %d compared, %d skipped (margin within the error)\n", compared,
              skipped);
  EXPECT_GT(compared, 3 * skipped);
}

}  // namespace
}  // namespace kvstream::model
