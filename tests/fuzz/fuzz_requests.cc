// Fuzzes the request checks the daemons run before a request takes resources:
// decode::CheckGenerateRequest and prefill::CheckPrefillRequest, on a parsed protobuf (bytes
// after the first 8) and limits taken from the first 8 bytes. What passes must fit the limits
// (sampling parameters included).
#include <cstdint>
#include <cstring>
#include <string>

#include <google/protobuf/stubs/logging.h>

#include "decode/generate_request.h"
#include "prefill/prefill_request.h"
#include "tests/fuzz/fuzz_util.h"

// Invalid UTF-8 in string fields is an expected input, not worth a log line per run.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvstream;
  if (size < 8) return 0;
  uint16_t f[4];
  std::memcpy(f, data, sizeof(f));
  // Limits of real deployments' order (vocabulary to 64K, positions to 64K, blocks of 1..256).
  decode::GenerateLimits limits{1 + f[0], 1 + f[1], 1 + (f[2] & 0xff), f[3]};
  if (f[2] & 0x100) limits = {32000, 4096, 16, 256};  // the tiny preset's daemon defaults
  const uint8_t* msg = data + 8;
  const int len = static_cast<int>(size - 8);
  v1::GenerateRequest g;
  if (g.ParseFromArray(msg, len)) {
    int need = -1;
    if (decode::CheckGenerateRequest(g, limits, &need).ok()) {
      const int64_t total = int64_t(g.prompt_tokens_size()) + g.max_tokens();
      if (need < 1 || need > limits.pool_blocks || total > limits.max_position ||
          int64_t(need) * limits.block_size < total)
        fuzz::Fail("accepted generate request does not fit the limits");
      if (!model::ValidateSamplingParams(decode::SamplingFromRequest(g, 1)).ok())
        fuzz::Fail("accepted generate request has invalid sampling parameters");
      const model::SamplingParams sp = decode::SamplingFromRequest(g, 1);
      if (sp.top_logprobs > model::kMaxTopLogprobs || !(sp.top_p > 0) || sp.top_k < 0)
        fuzz::Fail("accepted generate request with out-of-range sampling");
    }
  }
  v1::PrefillRequest p;
  if (p.ParseFromArray(msg, len) &&
      prefill::CheckPrefillRequest(p, limits.vocab_size, limits.max_position).ok()) {
    if (p.tokens_size() == 0 || p.tokens_size() > limits.max_position)
      fuzz::Fail("prefill of no tokens or more than max_position accepted");
    for (int32_t t : p.tokens())
      if (t < 0 || t >= limits.vocab_size) fuzz::Fail("prefill token outside the vocabulary");
  }
  return 0;
}
