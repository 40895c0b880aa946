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
  EXPECT_TRUE(o.cuda_ipc.gpu_landed_wait);
}

// The GPU backends' typed options (cuda_ipc, nccl) come from the same parser.
TEST(TransportOptions, GpuBackendKeysSetTheirTypedOptions) {
  TransportOptions o;
  ASSERT_TRUE(SetTransportOption(o, "cuda_ipc_copy_mode", "kernel").ok());
  ASSERT_TRUE(SetTransportOption(o, "cuda_ipc_connect_timeout_ms", "2500").ok());
  ASSERT_TRUE(SetTransportOption(o, "nccl_copy_mode", "pack").ok());
  ASSERT_TRUE(SetTransportOption(o, "nccl-chunk-mib", "16").ok());
  ASSERT_TRUE(SetTransportOption(o, "nccl_advertise_host", "10.0.0.7").ok());
  ASSERT_TRUE(SetTransportOption(o, "nccl_connect_timeout_ms", "30000").ok());
  ASSERT_TRUE(SetTransportOption(o, "nccl_trace", "on").ok());
  EXPECT_EQ(o.cuda_ipc.copy_mode, cuda_ipc::CopyMode::kKernel);
  EXPECT_EQ(o.cuda_ipc.connect_timeout_ms, 2500);
  EXPECT_EQ(o.nccl.copy_mode, nccl::CopyMode::kPack);
  EXPECT_EQ(o.nccl.chunk_bytes, 16u << 20);
  EXPECT_EQ(o.nccl.advertise_host, "10.0.0.7");
  EXPECT_EQ(o.nccl.connect_timeout_ms, 30000);
  EXPECT_TRUE(o.nccl.trace);
  // The rest keep the backends' defaults.
  const TransportOptions defaults;
  EXPECT_EQ(o.cuda_ipc.block_table, defaults.cuda_ipc.block_table);
  EXPECT_EQ(o.nccl.close_timeout_ms, defaults.nccl.close_timeout_ms);
}

TEST(TransportOptions, BadValuesAreRefusedNamingTheKeyAndChangeNothing) {
  TransportOptions o;
  for (auto [key, value] : {std::pair<const char*, const char*>{"ucx_copy_lanes", "33"},
                            {"ucx_copy_lanes", "two"},
                            {"staged_chunk_mib", "0"},
                            {"staged_zero_copy", "maybe"},
                            {"pace_bytes_per_s", "-5"},
                            {"itl_target_ms", "nan"},
                            {"gpu_landed_wait", "perhaps"},
                            {"cuda_ipc_copy_mode", "fast"},
                            {"cuda_ipc_connect_timeout_ms", "0"},
                            {"nccl_copy_mode", "auto,pack"},
                            {"nccl_chunk_mib", "0"},
                            {"nccl_advertise_host", ""},
                            {"nccl_trace", "2"}}) {
    Status s = SetTransportOption(o, key, value);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << key << "=" << value;
    EXPECT_NE(s.message().find(key), std::string::npos) << s.ToString();
  }
  const TransportOptions defaults;
  EXPECT_EQ(o.ucx.copy_lanes, defaults.ucx.copy_lanes);
  EXPECT_EQ(o.staged.chunk_bytes, defaults.staged.chunk_bytes);
  EXPECT_EQ(o.staged.zero_copy, defaults.staged.zero_copy);
  EXPECT_EQ(o.pacing.bytes_per_s, 0);
  EXPECT_FALSE(o.cuda_ipc.gpu_landed_wait);
  EXPECT_EQ(o.cuda_ipc.copy_mode, defaults.cuda_ipc.copy_mode);
  EXPECT_EQ(o.nccl.copy_mode, defaults.nccl.copy_mode);
  EXPECT_EQ(o.nccl.chunk_bytes, defaults.nccl.chunk_bytes);
  EXPECT_EQ(o.nccl.advertise_host, defaults.nccl.advertise_host);
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
