#include "daemon/daemon_runtime.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <grpcpp/generic/async_generic_service.h>
#include <grpc/support/log.h>
#include <grpcpp/health_check_service_interface.h>

#include "common/log.h"
#include "common/log_format.h"
#include "daemon/accept_guard.h"
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
  to.cuda_ipc.gpu_landed_wait = cfg.gpu_landed_wait;
  // The transport keys the configuration has no field for (checked when it was parsed).
  for (const auto& [key, value] : cfg.transport_options) {
    KV_RETURN_IF_ERROR(transport::SetTransportOption(to, key, value));
  }
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

ServerLimits ServerLimitsFromConfig(const DaemonConfig& cfg) {
  ServerLimits l;
  l.max_concurrent_streams = cfg.max_concurrent_streams;
  l.max_connection_idle_ms = cfg.max_connection_idle_ms;
  l.connection_setup_timeout_ms = cfg.connection_setup_timeout_ms;
  return l;
}

namespace {
// host and port of "host:port" / "[v6]:port"; false without a port.
bool SplitHostPort(const std::string& hp, std::string* host, std::string* port) {
  const size_t colon = hp.rfind(':');
  if (colon == std::string::npos || colon + 1 == hp.size()) return false;
  *host = hp.substr(0, colon);
  *port = hp.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']')
    *host = host->substr(1, host->size() - 2);
  return port->find_first_not_of("0123456789") == std::string::npos;
}

// Why `address` (numeric, as ResolveListenAddress returns) cannot be bound now, e.g. "Address
// already in use"; empty when a socket binds it.
std::string BindError(const std::string& address) {
  std::string host, port;
  if (!SplitHostPort(address, &host, &port)) return "";
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_PASSIVE;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &res) != 0 || !res)
    return "";
  std::string why;
  const int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0) why = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(res);
  return why;
}
}  // namespace

Result<std::string> ResolveListenAddress(const std::string& listen) {
  // A URI with a scheme is gRPC's to interpret; "[v6]:port" and "host:port" are ours.
  for (const char* scheme : {"unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:"})
    if (listen.rfind(scheme, 0) == 0) return listen;
  std::string host, port;
  if (!SplitHostPort(listen, &host, &port))
    return InvalidArgument("listen: '" + listen + "' is not host:port");
  if (host.empty() || host == "0.0.0.0" || host == "::") return listen;  // gRPC: one socket
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0 || !res)
    return InvalidArgument("listen: cannot resolve '" + host + "': " + gai_strerror(rc));
  const addrinfo* pick = res;
  for (const addrinfo* a = res; a; a = a->ai_next)
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
  char buf[INET6_ADDRSTRLEN] = {};
  const void* in = pick->ai_family == AF_INET
                       ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(pick->ai_addr)->sin_addr)
                       : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(pick->ai_addr)->sin6_addr);
  inet_ntop(pick->ai_family, in, buf, sizeof(buf));
  const bool v6 = pick->ai_family == AF_INET6;
  freeaddrinfo(res);
  return (v6 ? "[" + std::string(buf) + "]" : std::string(buf)) + ":" + port;
}

Result<std::unique_ptr<grpc::Server>> StartGrpcServer(const std::string& listen,
                                                      const std::vector<grpc::Service*>& services,
                                                      int* port, const ServerLimits& limits,
                                                      std::shared_ptr<grpc::ServerCredentials> credentials) {
  KV_ASSIGN_OR_RETURN(const std::string address, ResolveListenAddress(listen));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int bound = 0;
  if (!credentials) credentials = grpc::InsecureServerCredentials();
  builder.AddListeningPort(address, credentials, &bound);
  for (grpc::Service* s : services) builder.RegisterService(s);
  // No service of its own (the health-only listener): gRPC needs one to poll for calls; the
  // generic one answers every call but health's with UNIMPLEMENTED.
  static grpc::CallbackGenericService unimplemented;
  if (services.empty()) builder.RegisterCallbackGenericService(&unimplemented);
  // Many concurrent streaming calls each hold a handler thread.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 4);
  // Peers notice a lost daemon through sub-second keepalive pings (docs/daemons.md, faults):
  // accept them, also between calls, instead of answering GOAWAY "too_many_pings".
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 100);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // A port some other socket holds is an error, never shared (SO_REUSEPORT would split the
  // connections between the two processes).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  if (limits.max_concurrent_streams > 0)
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, limits.max_concurrent_streams);
  if (limits.max_connection_idle_ms > 0)
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                               static_cast<int>(limits.max_connection_idle_ms));
  // No grace period: calls in flight on an aged connection run to their end.
  if (limits.max_connection_age_ms > 0)
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, static_cast<int>(limits.max_connection_age_ms));
  if (limits.connection_setup_timeout_ms > 0)
    builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                               static_cast<int>(limits.connection_setup_timeout_ms));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound == 0) {
    const std::string why = BindError(address);
    return Unavailable("cannot listen on " + address +
                       (address != listen ? " (" + listen + ")" : "") +
                       (why.empty() ? "" : ": " + why));
  }
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

namespace {
// gRPC's own log records (gpr_log) as kvstream records, for --log_format json.
void GrpcLogToJson(gpr_log_func_args* args) {
  const LogLevel level = args->severity == GPR_LOG_SEVERITY_ERROR  ? LogLevel::kError
                         : args->severity == GPR_LOG_SEVERITY_INFO ? LogLevel::kInfo
                                                                   : LogLevel::kDebug;
  LogLine(level, args->file ? args->file : "grpc", args->line,
          std::string("grpc: ") + (args->message ? args->message : ""));
}
}  // namespace

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
  if (cfg->log_format == "json") {
    SetLogFormat(LogFormat::kJson);
    gpr_set_log_function(&GrpcLogToJson);  // gRPC's own records in the same form
  }
  const std::string& level = cfg->log_level;
  if (level == "debug") SetLogLevel(LogLevel::kDebug);
  else if (level == "info") SetLogLevel(LogLevel::kInfo);
  else if (level == "warn") SetLogLevel(LogLevel::kWarn);
  else if (level == "error") SetLogLevel(LogLevel::kError);
  KV_LOG_INFO << "kvstream-" << role << " starting: " << cfg->ToJson();
  InstallAcceptGuard(cfg->max_open_fds);
  return std::move(cfg).value();
}

int DaemonFailure(const std::string& role, const Status& status) {
  KV_LOG_ERROR << "kvstream-" << role << ": " << status.ToString();
  return status.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace kvstream::daemon
