#include "daemon/daemon_runtime.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include <grpcpp/health_check_service_interface.h>

#include "common/log.h"
#include "transport/pacing.h"
#ifdef KVSTREAM_DAEMON_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvstream::daemon {

model::ModelSpec ModelSpecFromConfig(const DaemonConfig& cfg) {
  model::ModelSpec spec;
  spec.model = cfg.model;
  spec.seed = cfg.seed;
  spec.num_layers_override = cfg.layers;
  spec.max_position_override = cfg.max_position;
  ParseDType(cfg.weight_dtype, &spec.weight_dtype);
  ParseDType(cfg.kv_dtype, &spec.kv_dtype);
  return spec;
}

Result<ServingModel> LoadServingModel(const DaemonConfig& cfg) {
  DType d;
  if (!ParseDType(cfg.weight_dtype, &d)) return InvalidArgument("unknown weight_dtype " + cfg.weight_dtype);
  if (!ParseDType(cfg.kv_dtype, &d)) return InvalidArgument("unknown kv_dtype " + cfg.kv_dtype);
  model::BackendOptions bo;
  bo.kind = cfg.backend;
  bo.device = cfg.device;
  bo.num_threads = cfg.threads;
  ServingModel m;
  KV_ASSIGN_OR_RETURN(m.backend, model::CreateBackend(ModelSpecFromConfig(cfg), bo));
  int blocks = cfg.pool_blocks;
  if (cfg.pool_gpu_fraction > 0) {
    KV_ASSIGN_OR_RETURN(blocks, PoolBlocksFromGpuFraction(cfg, m.backend->kv_layout(cfg.block_size)));
  }
  KV_ASSIGN_OR_RETURN(m.pool, m.backend->CreatePool(blocks, cfg.block_size));
  KV_LOG_INFO << "KV pool: " << blocks << " blocks of " << cfg.block_size << " tokens, "
              << m.pool->memory().size() / (1 << 20) << " MiB in "
              << (m.pool->memory().on_device() ? "device" : "host") << " memory";
  return m;
}

std::string ComputeDeviceId(const DaemonConfig& cfg) {
#ifdef KVSTREAM_DAEMON_HAVE_CUDA
  if (cfg.backend != "cuda") return "";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, cfg.device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  static const char* kHex = "0123456789abcdef";
  std::string id = "GPU-";
  for (int i = 0; i < 16; ++i) {
    const auto b = static_cast<unsigned char>(prop.uuid.bytes[i]);
    id += kHex[b >> 4];
    id += kHex[b & 15];
  }
  return id;
#else
  (void)cfg;
  return "";
#endif
}

bool ComputeDeviceSharedViaMps(const DaemonConfig& cfg) {
#ifdef KVSTREAM_DAEMON_HAVE_CUDA
  if (cfg.backend != "cuda") return false;
  // By number: the enumerator is missing from older CUDA 12 headers; an older driver answers
  // cudaErrorInvalidValue, read as "no".
  constexpr int kMpsEnabled = 133;
  int v = 0;
  if (cudaDeviceGetAttribute(&v, static_cast<cudaDeviceAttr>(kMpsEnabled), cfg.device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return v != 0;
#else
  (void)cfg;
  return false;
#endif
}

Result<int> PoolBlocksFromGpuFraction(const DaemonConfig& cfg, const model::KvLayout& layout) {
#ifdef KVSTREAM_DAEMON_HAVE_CUDA
  if (cfg.backend != "cuda") return InvalidArgument("pool_gpu_fraction needs --backend cuda");
  if (cudaSetDevice(cfg.device) != cudaSuccess) {
    (void)cudaGetLastError();
    return Unavailable("pool_gpu_fraction: cannot use CUDA device " + std::to_string(cfg.device));
  }
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaError_t e = cudaMemGetInfo(&free_bytes, &total_bytes); e != cudaSuccess) {
    (void)cudaGetLastError();
    return Unavailable(std::string("pool_gpu_fraction: cudaMemGetInfo: ") + cudaGetErrorString(e));
  }
  const size_t per_block = layout.pool_bytes(1);
  const size_t want = static_cast<size_t>(cfg.pool_gpu_fraction * double(free_bytes));
  const size_t blocks = per_block ? want / per_block : 0;
  KV_LOG_INFO << "pool_gpu_fraction " << cfg.pool_gpu_fraction << " of " << free_bytes / (1 << 20)
              << " MiB free (of " << total_bytes / (1 << 20) << ") on device " << cfg.device
              << ": " << blocks << " blocks";
  if (blocks == 0)
    return ResourceExhausted("pool_gpu_fraction " + std::to_string(cfg.pool_gpu_fraction) +
                             " of " + std::to_string(free_bytes) + " free bytes holds no block of " +
                             std::to_string(per_block) + " bytes");
  return static_cast<int>(std::min<size_t>(blocks, size_t(1) << 30));
#else
  return NotSupported("pool_gpu_fraction: this build has no CUDA");
#endif
}

Result<std::string> ResolveTransportBackend(const DaemonConfig& cfg) {
  if (cfg.backend != "cuda" || cfg.transport != "ucx") return cfg.transport;
  // GPU pools over "ucx": UCX itself where it can touch CUDA memory, else host staging.
  transport::TransportOptions to;
  to.backend = "ucx";
  to.ucx.tls = cfg.ucx_tls;
  to.ucx.net_devices = cfg.ucx_net_devices;
  to.device = cfg.device;
  KV_ASSIGN_OR_RETURN(std::string name, transport::ResolveBackend(to, transport::MemoryKind::kCuda));
  KV_LOG_INFO << "transport ucx with a GPU pool: using " << name;
  return name;
}

Result<std::unique_ptr<transport::Transport>> CreateTransportFromConfig(const DaemonConfig& cfg,
                                                                        const std::string& role) {
  transport::TransportOptions to;
  KV_ASSIGN_OR_RETURN(to.backend, ResolveTransportBackend(cfg));
  to.ucx.tls = cfg.ucx_tls;
  to.ucx.net_devices = cfg.ucx_net_devices;
  to.pacing.bytes_per_s = double(cfg.pace_bytes_per_s);
  to.pacing.burst_bytes = cfg.pace_burst_bytes;
  to.pacing.itl_target_ms = role == "decode" ? 0 : cfg.itl_target_ms;
  to.pacing.itl_idle_step_ms = cfg.itl_idle_step_ms;
  to.pacing.itl_step_hbm_bytes = cfg.itl_step_hbm_bytes;
  to.pacing.itl_device_bw_bytes_per_s = cfg.itl_device_bw_bytes_per_s;
  to.pacing.itl_hbm_bytes_per_byte = cfg.itl_hbm_bytes_per_byte;
  to.device = cfg.backend == "cuda" ? cfg.device : -1;
  to.cuda_ipc_gpu_landed_wait = cfg.gpu_landed_wait;
  // The rate the writes will be held to, in the log (and refused here, with the key named,
  // when the ITL budget has none).
  KV_ASSIGN_OR_RETURN(transport::PacingOptions pacing, transport::ResolvePacing(to));
  if (pacing.bytes_per_s > 0) {
    KV_LOG_INFO << "KV writes paced at " << pacing.bytes_per_s / 1e9 << " GB/s (burst "
                << pacing.burst_bytes << " bytes, chunk " << pacing.chunk_bytes << " bytes"
                << (cfg.pace_bytes_per_s > 0 ? ", pace_bytes_per_s" : ", from itl_target_ms")
                << ")";
  }
  return transport::CreateTransport(to);
}

Result<std::unique_ptr<grpc::Server>> StartGrpcServer(const std::string& listen,
                                                      const std::vector<grpc::Service*>& services,
                                                      int* port) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int bound = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &bound);
  for (grpc::Service* s : services) builder.RegisterService(s);
  // Many concurrent streaming calls each hold a handler thread.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 4);
  // Peers notice a lost daemon through sub-second keepalive pings (docs/daemons.md, faults):
  // accept them, also between calls, instead of answering GOAWAY "too_many_pings".
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 100);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound == 0) return Unavailable("cannot listen on " + listen);
  if (server->GetHealthCheckService()) server->GetHealthCheckService()->SetServingStatus(true);
  *port = bound;
  return server;
}

Status WritePortFile(const std::string& path, int port) {
  if (path.empty()) return OkStatus();
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) return InvalidArgument("cannot write port file " + tmp);
    out << port << "\n";
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return Internal("cannot rename " + tmp);
  return OkStatus();
}

std::optional<DaemonConfig> StartDaemon(int argc, char** argv, const std::string& role,
                                        int* exit_code) {
  auto cfg = ParseDaemonConfig(argc, argv, role);
  if (!cfg.ok()) {
    if (cfg.status().code() == StatusCode::kNotFound) {  // --help
      std::fputs(cfg.status().message().c_str(), stdout);
      *exit_code = 0;
    } else {
      std::fprintf(stderr, "kvstream-%s: %s\n%s", role.c_str(), cfg.status().ToString().c_str(),
                   DaemonUsage(role).c_str());
      *exit_code = 2;
    }
    return std::nullopt;
  }
  const std::string& level = cfg->log_level;
  if (level == "debug") SetLogLevel(LogLevel::kDebug);
  else if (level == "info") SetLogLevel(LogLevel::kInfo);
  else if (level == "warn") SetLogLevel(LogLevel::kWarn);
  else if (level == "error") SetLogLevel(LogLevel::kError);
  KV_LOG_INFO << "kvstream-" << role << " starting: " << cfg->ToJson();
  return std::move(cfg).value();
}

int DaemonFailure(const std::string& role, const Status& status) {
  KV_LOG_ERROR << "kvstream-" << role << ": " << status.ToString();
  return status.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace kvstream::daemon
