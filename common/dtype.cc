#include "common/dtype.h"

namespace kvstream {

bool ParseDType(std::string_view n, DType* out) {
  if (n == "f32" || n == "fp32" || n == "float32" || n == "F32") { *out = DType::kF32; return true; }
  if (n == "f16" || n == "fp16" || n == "float16" || n == "F16") { *out = DType::kF16; return true; }
  if (n == "bf16" || n == "bfloat16" || n == "BF16") { *out = DType::kBF16; return true; }
  return false;
}

}  // namespace kvstream
