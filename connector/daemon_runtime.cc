#include "connector/daemon_runtime.h"

#include <csignal>
#include <cstdio>
#include <fstream>

#include <grpcpp/health_check_service_interface.h>

#include "common/log.h"

namespace kvstream::connector {

model::ModelSpec ModelSpecFromConfig(const DaemonConfig& cfg) {
  model::ModelSpec spec;
  spec.model = cfg.model;
  spec.seed = cfg.seed;
  spec.num_layers_override = cfg.layers;
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
  KV_ASSIGN_OR_RETURN(m.pool, m.backend->CreatePool(cfg.pool_blocks, cfg.block_size));
  return m;
}

Result<std::unique_ptr<transport::Transport>> CreateTransportFromConfig(const DaemonConfig& cfg) {
  transport::TransportOptions to;
  to.backend = cfg.transport;
  to.ucx_tls = cfg.ucx_tls;
  to.ucx_net_devices = cfg.ucx_net_devices;
  to.pace_bytes_per_s = double(cfg.pace_bytes_per_s);
  to.pace_burst_bytes = cfg.pace_burst_bytes;
  to.device = cfg.backend == "cuda" ? cfg.device : -1;
  return transport::CreateTransport(to);
}

namespace {
sigset_t TerminationSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}
}  // namespace

void BlockTerminationSignals() {
  sigset_t set = TerminationSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // A peer closing a socket must surface as an error on the write, not kill the daemon.
  std::signal(SIGPIPE, SIG_IGN);
}

int WaitForTerminationSignal() {
  sigset_t set = TerminationSet();
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  return sig;
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

}  // namespace kvstream::connector
