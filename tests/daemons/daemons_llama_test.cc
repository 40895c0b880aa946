// A llama-shaped preset (llama-2-7b's shapes: 32 MHA heads of 128, MLP 11008) cut to 2 layers,
// disaggregated over real processes: tokens equal the decode daemon computing the prompt
// itself (LOCAL: the colocated path in the same binary), pipelined and not. Loading the dummy
// weights dominates the run time, so one daemon pair serves every case.
#include "tests/daemons/disagg_fixture.h"

namespace kvstream::testing {
namespace {

namespace v1 = kvstream::v1;

TEST_F(DisaggTest, LlamaShapedTwoLayersEqualsColocated) {
  DaemonPair pair;
  pair.common = {"--model=llama-2-7b", "--layers=2", "--pool_blocks=16"};
  ASSERT_NO_FATAL_FAILURE(StartDaemonsTogether(pair));
  for (int n : {1, 20}) {
    auto prompt = MakePrompt(n, 32000, 77 + n);
    auto local = CallGenerate(*stub_, prompt, 3, v1::LOAD_MODE_LOCAL, 120000);
    ASSERT_TRUE(local.status.ok()) << local.status.error_message();
    ASSERT_EQ(local.tokens.size(), 3u);
    for (auto mode : {v1::LOAD_MODE_PIPELINED, v1::LOAD_MODE_NON_PIPELINED}) {
      auto r = CallGenerate(*stub_, prompt, 3, mode, 120000);
      ASSERT_TRUE(r.status.ok()) << r.status.error_message();
      EXPECT_EQ(r.tokens, local.tokens) << "prompt " << n << " mode " << mode;
      EXPECT_EQ(r.messages.front().load().loaded_remotely(), n > 1);
    }
  }
  EXPECT_TRUE(WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(5000)).ok());
  EXPECT_TRUE(WaitForAllBlocksFree(prefill_address(), false, DeadlineAfterMs(5000)).ok());
}

}  // namespace
}  // namespace kvstream::testing
