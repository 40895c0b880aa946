#include "daemon/daemon_config.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

namespace kvstream::daemon {
namespace {

Result<DaemonConfig> Parse(std::vector<std::string> args, const std::string& role = "prefill") {
  args.insert(args.begin(), "kvstream-" + role);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return ParseDaemonConfig(static_cast<int>(argv.size()), argv.data(), role);
}

TEST(DaemonConfig, FlagsInBothSpellings) {
  auto c = Parse({"--pool_blocks=64", "--block-size", "32", "--pipelining=off", "--model", "tiny"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->pool_blocks, 64);
  EXPECT_EQ(c->block_size, 32);
  EXPECT_FALSE(c->pipelining);
}

TEST(DaemonConfig, KvTierWritePolicy) {
  auto c = Parse({});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->kv_tier_write_policy, "write_through");
  c = Parse({"--kv_host_tier_mb=64", "--prompt_cache_blocks=32", "--kv-tier-write-policy", "write_back"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->kv_tier_write_policy, "write_back");
  // No tier: nothing to write back, nothing refused.
  c = Parse({"--kv_tier_write_policy=write_back"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  // The decode, which has no prompt cache, ignores it.
  c = Parse({"--peer=127.0.0.1:1", "--kv_store_redis=unix:/tmp/r.sock", "--kv_tier_secret_file=/tmp/s",
             "--kv_store_insecure", "--kv_tier_write_policy=write_back"}, "decode");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
}

// Found by tests/fuzz/fuzz_daemon_config (its corpus keeps the input): a flag value that is not
// UTF-8 made ToJson(), which the daemons log at start, throw nlohmann::type_error (an abort).
TEST(DaemonConfig, ToJsonOfAValueThatIsNotUtf8) {
  auto c = Parse({"--peer=127.0.0.1:1,\xa2host:2"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::string json;
  ASSERT_NO_THROW(json = c->ToJson());
  EXPECT_NE(json.find("\"peer\":\"127.0.0.1:1,\xef\xbf\xbdhost:2\""), std::string::npos) << json;
}

TEST(DaemonConfig, FileThenFlagsWin) {
  std::string path = ::testing::TempDir() + "/kvstream_cfg_test.json";
  {
    std::ofstream f(path);
    f << R"({"pool_blocks": 100, "listen": "127.0.0.1:7000", "pipelining": false,
            "peer": "127.0.0.1:7001", "quarantine_ms": 10})";
  }
  auto c = Parse({"--config", path, "--pool_blocks=50"}, "decode");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->pool_blocks, 50);
  EXPECT_EQ(c->listen, "127.0.0.1:7000");
  EXPECT_EQ(c->peer, "127.0.0.1:7001");
  EXPECT_FALSE(c->pipelining);
  EXPECT_EQ(c->quarantine_ms, 10);
  std::remove(path.c_str());
}

// Transport keys without a field of their own (transport/options.h) reach the transport's one
// parser from the file and from flags, in that order, and are listed by --help.
TEST(DaemonConfig, TransportKeysGoToTheTransportsParser) {
  std::string path = ::testing::TempDir() + "/kvstream_cfg_transport_test.json";
  {
    std::ofstream f(path);
    f << R"({"nccl_chunk_mib": 16, "nccl_trace": true, "staged_zero_copy": "off"})";
  }
  auto c = Parse({"--config", path, "--nccl-advertise-host=10.0.0.7", "--ucx_copy_lanes", "2"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const std::vector<std::pair<std::string, std::string>> want = {
      {"nccl_chunk_mib", "16"}, {"nccl_trace", "true"}, {"staged_zero_copy", "off"},
      {"nccl_advertise_host", "10.0.0.7"}, {"ucx_copy_lanes", "2"}};
  EXPECT_EQ(c->transport_options, want);
  EXPECT_NE(c->ToJson().find("\"nccl_advertise_host\":\"10.0.0.7\""), std::string::npos);
  // A bad value is refused naming the key; a key nobody has is still unknown.
  auto bad = Parse({"--nccl_copy_mode=fastest"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("nccl_copy_mode"), std::string::npos) << bad.status().ToString();
  auto unknown = Parse({"--nccl_no_such_key=1"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("unknown flag"), std::string::npos);
  {
    std::ofstream f(path);
    f << R"({"cuda_ipc_copy_mode": 3})";
  }
  EXPECT_EQ(Parse({"--config", path}).status().code(), StatusCode::kInvalidArgument);
  std::remove(path.c_str());
  const std::string usage = DaemonUsage("prefill");
  for (const char* key : {"--nccl_advertise_host", "--cuda_ipc_copy_mode", "--staged_chunk_mib"}) {
    EXPECT_NE(usage.find(key), std::string::npos) << key;
  }
}

// A boolean transport key alone on the command line means true, as a boolean field does; it used
// to take the next flag as its value ("--nccl_trace --pool_blocks=8" refused, "--nccl_trace
// --listen" swallowing "--listen").
TEST(DaemonConfig, BooleanTransportKeyAloneMeansTrue) {
  auto c = Parse({"--nccl_trace", "--pool_blocks=8", "--ucx-same-host-copy", "--listen",
                  "127.0.0.1:7000", "--ucx_same_host_copy", "false", "--model", "tiny"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->pool_blocks, 8);
  EXPECT_EQ(c->model, "tiny");
  EXPECT_EQ(c->listen, "127.0.0.1:7000");
  const std::vector<std::pair<std::string, std::string>> want = {
      {"nccl_trace", "true"}, {"ucx_same_host_copy", "true"}, {"ucx_same_host_copy", "false"}};
  EXPECT_EQ(c->transport_options, want);
  auto last = Parse({"--model", "tiny", "--nccl_trace"});
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(last->transport_options.back().second, "true");
  // A key that takes a value still needs one.
  EXPECT_FALSE(Parse({"--nccl_chunk_mib"}).ok());
}

TEST(DaemonConfig, PoolGpuFraction) {
  auto c = Parse({"--backend=cuda", "--pool_gpu_fraction=0.25"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_DOUBLE_EQ(c->pool_gpu_fraction, 0.25);
  std::string path = ::testing::TempDir() + "/kvstream_cfg_gpu_test.json";
  {
    std::ofstream f(path);
    f << R"({"backend": "cuda", "pool_gpu_fraction": 0.5, "transport": "cuda_ipc"})";
  }
  c = Parse({"--config", path});
  std::remove(path.c_str());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_DOUBLE_EQ(c->pool_gpu_fraction, 0.5);
  EXPECT_EQ(c->transport, "cuda_ipc");
  // Out of range, not a number, or on a backend whose pool is not in GPU memory.
  for (std::vector<std::string> bad : {std::vector<std::string>{"--backend=cuda", "--pool_gpu_fraction=1"},
                                       {"--backend=cuda", "--pool_gpu_fraction=-0.1"},
                                       {"--backend=cuda", "--pool_gpu_fraction=half"},
                                       {"--pool_gpu_fraction=0.5"}}) {
    auto b = Parse(bad);
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << bad.back();
    EXPECT_NE(b.status().message().find("pool_gpu_fraction"), std::string::npos)
        << b.status().ToString();
  }
}

TEST(DaemonConfig, BadInputIsRefusedNamingIt) {
  auto c = Parse({"--pool_blocks=lots"});
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("pool_blocks"), std::string::npos);
  c = Parse({"--no_such_flag=1"});
  EXPECT_NE(c.status().message().find("no_such_flag"), std::string::npos);
  c = Parse({"--on_load_failure=retry"});
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  c = Parse({}, "decode");  // decode needs its prefill peer
  EXPECT_NE(c.status().message().find("peer"), std::string::npos);
  c = Parse({"--config", "/nonexistent/kvstream.json"});
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Parse({"--help"}).status().code(), StatusCode::kNotFound);
}

// first_step_after_load: auto by default; auto waits for the whole load only when the prefill
// computes on this very GPU (same device id from the handshake).
TEST(DaemonConfig, FirstStepAfterLoadAutoByDefaultAndResolvedByDevice) {
  auto c = Parse({"--peer=127.0.0.1:1"}, "decode");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->first_step_after_load, "auto");
  for (const char* v : {"true", "false", "auto"}) {
    auto d = Parse({"--peer=127.0.0.1:1", std::string("--first_step_after_load=") + v}, "decode");
    ASSERT_TRUE(d.ok()) << v;
    EXPECT_EQ(d->first_step_after_load, v);
  }
  auto bad = Parse({"--peer=127.0.0.1:1", "--first_step_after_load=sometimes"}, "decode");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("first_step_after_load"), std::string::npos);

  const std::string gpu0 = "GPU-00112233445566778899aabbccddeeff";
  const std::string gpu1 = "GPU-ffeeddccbbaa99887766554433221100";
  EXPECT_TRUE(ResolveFirstStepAfterLoad("auto", gpu0, gpu0));
  EXPECT_FALSE(ResolveFirstStepAfterLoad("auto", gpu0, gpu1));
  EXPECT_FALSE(ResolveFirstStepAfterLoad("auto", "", ""));      // CPU backends
  EXPECT_FALSE(ResolveFirstStepAfterLoad("auto", gpu0, ""));    // no handshake yet / CPU prefill
  EXPECT_TRUE(ResolveFirstStepAfterLoad("true", gpu0, gpu1));
  EXPECT_TRUE(ResolveFirstStepAfterLoad("true", "", ""));
  EXPECT_FALSE(ResolveFirstStepAfterLoad("false", gpu0, gpu0));
  // One GPU shared through MPS: no time slicing, so auto keeps the layer-by-layer first step;
  // an explicit "true" still holds.
  EXPECT_FALSE(ResolveFirstStepAfterLoad("auto", gpu0, gpu0, /*local_shared_via_mps=*/true));
  EXPECT_TRUE(ResolveFirstStepAfterLoad("auto", gpu0, gpu0, /*local_shared_via_mps=*/false));
  EXPECT_TRUE(ResolveFirstStepAfterLoad("true", gpu0, gpu0, /*local_shared_via_mps=*/true));
}

// kv_decode_loads_prefix: auto by default; auto loads unless the data plane is GPU to GPU on
// one host (cuda_ipc, nccl: faster than the decode's own read up from host memory).
TEST(DaemonConfig, DecodeLoadsPrefixAutoUnlessGpuToGpu) {
  auto c = Parse({"--peer=127.0.0.1:1"}, "decode");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->kv_decode_loads_prefix, "auto");
  auto bad = Parse({"--peer=127.0.0.1:1", "--kv_decode_loads_prefix=yes"}, "decode");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("kv_decode_loads_prefix"), std::string::npos);
  for (const char* t : {"ucx", "ucx_staged"}) EXPECT_TRUE(ResolveDecodeLoadsPrefix("auto", t)) << t;
  for (const char* t : {"cuda_ipc", "nccl"}) EXPECT_FALSE(ResolveDecodeLoadsPrefix("auto", t)) << t;
  EXPECT_TRUE(ResolveDecodeLoadsPrefix("true", "cuda_ipc"));
  EXPECT_FALSE(ResolveDecodeLoadsPrefix("false", "ucx"));
}

// gpu_landed_wait: off by default; accepted with cuda_ipc and the CUDA backend only (the GPU
// wait is on landed flags the cuda_ipc writer's copy stream writes).
TEST(DaemonConfig, GpuLandedWaitNeedsCudaIpcAndTheCudaBackend) {
  auto c = Parse({"--peer=127.0.0.1:1"}, "decode");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->gpu_landed_wait);
  auto on = Parse({"--peer=127.0.0.1:1", "--backend=cuda", "--transport=cuda_ipc",
                   "--gpu_landed_wait=true"},
                  "decode");
  ASSERT_TRUE(on.ok()) << on.status().ToString();
  EXPECT_TRUE(on->gpu_landed_wait);
  for (auto args : {std::vector<std::string>{"--peer=127.0.0.1:1", "--backend=cuda",
                                             "--transport=ucx", "--gpu_landed_wait=true"},
                    std::vector<std::string>{"--peer=127.0.0.1:1", "--backend=cpu",
                                             "--transport=cuda_ipc", "--gpu_landed_wait=true"}}) {
    auto bad = Parse(args, "decode");
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find("gpu_landed_wait needs"), std::string::npos)
        << bad.status().ToString();
  }
}

// Several prefills: a comma-separated flag, or a JSON array in the file; each element must be
// host:port.
TEST(DaemonConfig, PeerListFromFlagOrJsonArray) {
  auto c = Parse({"--peer=10.0.0.1:7001,10.0.0.2:7001"}, "decode");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(SplitPeers(c->peer), (std::vector<std::string>{"10.0.0.1:7001", "10.0.0.2:7001"}));
  const std::string path = ::testing::TempDir() + "/peers.json";
  {
    std::ofstream f(path);
    f << R"({"peer": ["a:1", "b:2", "c:3"]})";
  }
  c = Parse({"--config", path}, "decode");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(SplitPeers(c->peer), (std::vector<std::string>{"a:1", "b:2", "c:3"}));
  {
    std::ofstream f(path);
    f << R"({"peer": ["a:1", 7]})";
  }
  EXPECT_EQ(Parse({"--config", path}, "decode").status().code(), StatusCode::kInvalidArgument);
  for (const char* bad : {"--peer=a:1,", "--peer=a", "--peer=:1", "--peer=a:1,,b:2"}) {
    auto b = Parse({bad}, "decode");
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(b.status().message().find("host:port"), std::string::npos) << b.status().ToString();
  }
}

TEST(DaemonConfig, ItlTargetKeysFromFileAndFlags) {
  std::string path = ::testing::TempDir() + "/kvstream_cfg_itl_test.json";
  {
    std::ofstream f(path);
    f << R"({"itl_target_ms": 12, "itl_idle_step_ms": 10, "itl_device_bw_bytes_per_s": 4.3e12,
            "itl_hbm_bytes_per_byte": 2.5, "prompt_cache_blocks": 64})";
  }
  auto c = Parse({"--config", path, "--itl-idle-step-ms=9.5"});
  std::remove(path.c_str());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_DOUBLE_EQ(c->itl_target_ms, 12);
  EXPECT_DOUBLE_EQ(c->itl_idle_step_ms, 9.5);  // the flag wins over the file
  EXPECT_DOUBLE_EQ(c->itl_device_bw_bytes_per_s, 4.3e12);
  EXPECT_DOUBLE_EQ(c->itl_hbm_bytes_per_byte, 2.5);
  EXPECT_EQ(c->prompt_cache_blocks, 64);
  EXPECT_EQ(c->pace_bytes_per_s, 0u);
  // Defaults: no target, k = 2, no prompt cache.
  auto d = Parse({});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->itl_target_ms, 0);
  EXPECT_EQ(d->itl_hbm_bytes_per_byte, 2);
  EXPECT_EQ(d->prompt_cache_blocks, 0);
  // The step's HBM bytes instead of a measured idle step; an explicit rate makes the ITL
  // fields moot (it wins), so they are not required then.
  EXPECT_TRUE(Parse({"--itl_target_ms=5", "--itl_step_hbm_bytes=1e10",
                     "--itl_device_bw_bytes_per_s=4e12"}).ok());
  EXPECT_TRUE(Parse({"--itl_target_ms=5", "--pace_bytes_per_s=1000000"}).ok());
  // The prefill needs the step's cost to turn a target into a rate; the decode learns it from
  // its own steps (join budget), so a bare target is enough there.
  EXPECT_FALSE(Parse({"--itl_target_ms=5"}).ok());
  auto dec = Parse({"--itl_target_ms=5", "--peer=127.0.0.1:1"}, "decode");
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  EXPECT_DOUBLE_EQ(dec->itl_target_ms, 5);
  // ToJson carries the new keys (the daemons log their resolved config).
  EXPECT_NE(c->ToJson().find("\"itl_target_ms\":12"), std::string::npos) << c->ToJson();
}

TEST(DaemonConfig, BadItlValuesAreRefusedNamingTheKey) {
  struct Case {
    std::vector<std::string> args;
    const char* key;
  };
  const std::vector<Case> cases = {
      {{"--itl_target_ms=-1"}, "itl_target_ms"},
      {{"--itl_target_ms=nan"}, "itl_target_ms"},
      {{"--itl_target_ms=inf"}, "itl_target_ms"},
      {{"--itl_target_ms=fast"}, "itl_target_ms"},
      {{"--itl_idle_step_ms=-2"}, "itl_idle_step_ms"},
      {{"--itl_device_bw_bytes_per_s=-1"}, "itl_device_bw_bytes_per_s"},
      {{"--itl_hbm_bytes_per_byte=0"}, "itl_hbm_bytes_per_byte"},
      {{"--itl_hbm_bytes_per_byte=-2"}, "itl_hbm_bytes_per_byte"},
      // A target without the bandwidth, or without the idle step (nor its bytes).
      {{"--itl_target_ms=12", "--itl_idle_step_ms=10"}, "itl_device_bw_bytes_per_s"},
      {{"--itl_target_ms=12", "--itl_device_bw_bytes_per_s=4e12"}, "itl_idle_step_ms"},
      // A target the idle step already misses: no rate keeps it.
      {{"--itl_target_ms=10", "--itl_idle_step_ms=10", "--itl_device_bw_bytes_per_s=4e12"},
       "itl_target_ms"},
      {{"--itl_target_ms=1", "--itl_step_hbm_bytes=8e9", "--itl_device_bw_bytes_per_s=4e12"},
       "itl_target_ms"},
      {{"--prompt_cache_blocks=-1"}, "prompt_cache_blocks"},
      {{"--pool_blocks=16", "--prompt_cache_blocks=16"}, "prompt_cache_blocks"},
      {{"--kv_host_tier_mb=-1"}, "kv_host_tier_mb"},
      {{"--kv_disk_tier_dir=/tmp/x", "--kv_disk_tier_mb=0"}, "kv_disk_tier_mb"},
      {{"--kv_tier_max_age_s=-5"}, "kv_tier_max_age_s"},
      {{"--kv_disk_tier_dir=/tmp/x"}, "kv_tier_secret_file"},
      {{"--kv_disk_tier_erase"}, "kv_disk_tier_erase"},
      {{"--kv_tier_policy=sometimes"}, "kv_tier_policy"},
      {{"--kv_tier_timeout_ms=-1"}, "kv_tier_timeout_ms"},
      {{"--kv_prefetch_threshold_tokens=-1"}, "kv_prefetch_threshold_tokens"},
      {{"--kv_tier_io_threads=0"}, "kv_tier_io_threads"},
      {{"--kv_tier_write_threads=0"}, "kv_tier_write_threads"},
      {{"--kv_tier_write_policy=write_around"}, "kv_tier_write_policy"},
      {{"--kv_tier_write_policy=WRITE_BACK"}, "kv_tier_write_policy"},
      // Write-back writes on the prompt cache's evictions: without a cache, never.
      {{"--kv_host_tier_mb=64", "--kv_tier_write_policy=write_back"}, "prompt_cache_blocks"},
      {{"--kv_store_redis=unix:/tmp/r.sock", "--kv_store_insecure"}, "kv_tier_secret_file"},
      {{"--kv_store_redis=unix:/tmp/r.sock", "--kv_tier_secret_file=/tmp/s"}, "kv_store_auth_file"},
      {{"--kv_store_redis=unix:/tmp/r.sock", "--kv_tier_secret_file=/tmp/s", "--kv_store_insecure",
        "--kv_store_ttl_s=0"}, "kv_store_ttl_s"},
      {{"--kv_store_redis=unix:/tmp/r.sock", "--kv_tier_secret_file=/tmp/s", "--kv_store_insecure",
        "--kv_store_timeout_ms=0"}, "kv_store_timeout_ms"},
      {{"--kv_store_redis=unix:/tmp/r.sock", "--kv_tier_secret_file=/tmp/s", "--kv_store_insecure",
        "--kv_store_max_pending_mb=0"}, "kv_store_max_pending_mb"},
      {{"--prefill_routing=random"}, "prefill_routing"},
      {{"--prefill_routing=Prefix"}, "prefill_routing"},
      {{"--prefill_route_blocks=0"}, "prefill_route_blocks"},
      {{"--prefill_route_slack=0"}, "prefill_route_slack"},
      {{"--prefill_route_slack=-3"}, "prefill_route_slack"},
  };
  for (const Case& k : cases) {
    auto c = Parse(k.args);
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << k.args.back();
    EXPECT_NE(c.status().message().find(k.key), std::string::npos)
        << k.args.back() << ": " << c.status().ToString();
  }
}

}  // namespace
}  // namespace kvstream::daemon
