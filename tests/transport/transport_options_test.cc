// transport/options.h: one parser for every transport option.
#include <gtest/gtest.h>

#include <string>

#include "transport/options.h"

namespace kvstream::transport {
namespace {

TEST(TransportOptions, KeysSetTheirBackendsFields) {
  TransportOptions o;
  ASSERT_TRUE(SetTransportOption(o, "transport", "ucx_staged").ok());
  ASSERT_TRUE(SetTransportOption(o, "ucx_tls", "sm,tcp").ok());
  ASSERT_TRUE(SetTransportOption(o, "ucx-net-devices", "lo").ok());
  ASSERT_TRUE(SetTransportOption(o, "ucx_same_host_copy", "false").ok());
  ASSERT_TRUE(SetTransportOption(o, "ucx_copy_lanes", "4").ok());
  ASSERT_TRUE(SetTransportOption(o, "staged_zero_copy", "off").ok());
  ASSERT_TRUE(SetTransportOption(o, "staged_chunk_mib", "2").ok());
  ASSERT_TRUE(SetTransportOption(o, "staged_fill_kib", "0").ok());
  ASSERT_TRUE(SetTransportOption(o, "pace_bytes_per_s", "1e9").ok());
  ASSERT_TRUE(SetTransportOption(o, "itl_target_ms", "12.5").ok());
  ASSERT_TRUE(SetTransportOption(o, "gpu_landed_wait", "true").ok());
  EXPECT_EQ(o.backend, "ucx_staged");
  EXPECT_EQ(o.ucx.tls, "sm,tcp");
  EXPECT_EQ(o.ucx.net_devices, "lo");
  EXPECT_FALSE(o.ucx.same_host_copy);
  EXPECT_EQ(o.ucx.copy_lanes, 4);
  EXPECT_EQ(o.staged.zero_copy, staged::ZeroCopy::kOff);
  EXPECT_EQ(o.staged.chunk_bytes, 2u << 20);
  EXPECT_EQ(o.staged.adaptive_chunk_fill, 0u);
  EXPECT_DOUBLE_EQ(o.pacing.bytes_per_s, 1e9);
  EXPECT_DOUBLE_EQ(o.pacing.itl_target_ms, 12.5);
  EXPECT_TRUE(o.cuda_ipc_gpu_landed_wait);
}

TEST(TransportOptions, BadValuesAreRefusedNamingTheKeyAndChangeNothing) {
  TransportOptions o;
  for (auto [key, value] : {std::pair<const char*, const char*>{"ucx_copy_lanes", "33"},
                            {"ucx_copy_lanes", "two"},
                            {"staged_chunk_mib", "0"},
                            {"staged_zero_copy", "maybe"},
                            {"pace_bytes_per_s", "-5"},
                            {"itl_target_ms", "nan"},
                            {"gpu_landed_wait", "perhaps"}}) {
    Status s = SetTransportOption(o, key, value);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << key << "=" << value;
    EXPECT_NE(s.message().find(key), std::string::npos) << s.ToString();
  }
  const TransportOptions defaults;
  EXPECT_EQ(o.ucx.copy_lanes, defaults.ucx.copy_lanes);
  EXPECT_EQ(o.staged.chunk_bytes, defaults.staged.chunk_bytes);
  EXPECT_EQ(o.staged.zero_copy, defaults.staged.zero_copy);
  EXPECT_EQ(o.pacing.bytes_per_s, 0);
  EXPECT_FALSE(o.cuda_ipc_gpu_landed_wait);
  EXPECT_EQ(SetTransportOption(o, "model", "tiny").code(), StatusCode::kNotFound);
}

TEST(TransportOptions, EveryListedKeyIsParsedAndHasHelp) {
  for (const TransportOptionKey& k : TransportOptionKeys()) {
    EXPECT_NE(std::string(k.help), "") << k.name;
    TransportOptions o;
    EXPECT_NE(SetTransportOption(o, k.name, "").code(), StatusCode::kNotFound) << k.name;
  }
}

}  // namespace
}  // namespace kvstream::transport
