// kvstream stats: what the daemons report about themselves (their Stats RPC): role, model,
// backend, transport, KV pool (blocks free of total, block bytes), requests in flight, and the
// counters since start (requests, tokens, KV bytes moved, handshakes, prompt-cache hits, ...).
//
//   kvstream stats --decode HOST:PORT [--prefill HOST:PORT[,HOST:PORT...]] [--json] [--deadline-ms N]
//
// One line per daemon (or one JSON object per line with --json, the StatsResponse as protobuf
// JSON). Exit 1 if any daemon did not answer within the deadline (the others are still printed).
#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/remote.h"

#if KVSTREAM_CLI_HAVE_DAEMONS
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include "daemon/daemon_config.h"  // SplitPeers
#include "connector/grpc_status.h"
#include "proto/kvstream.grpc.pb.h"
#endif

namespace kvstream::cli {

#if KVSTREAM_CLI_HAVE_DAEMONS
namespace {
namespace v1 = kvstream::v1;

template <typename Service>
Result<v1::StatsResponse> StatsAt(const Flags& flags, const std::string& address,
                                  int64_t deadline_ms) {
  KV_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel, RemoteChannel(flags, address));
  auto stub = Service::NewStub(channel);
  return FetchStats(*stub, deadline_ms, "Stats of " + address);
}

void PrintLine(const std::string& address, const v1::StatsResponse& r) {
  const auto& p = r.pool();
  const auto& c = r.counters();
  std::printf(
      "%-8s %-21s %-12s %-8s %-10s pool %d/%d blocks free (%.0f KiB/block) | in flight %d | "
      "requests %llu ok %llu failed %llu cancelled %llu | tokens %llu | KV moved %.3f GiB | "
      "handshakes %llu | recomputed %llu | quarantined %d | prompt cache %llu hits %llu misses\n",
      r.role().c_str(), address.c_str(), r.model_name().c_str(), r.backend().c_str(),
      r.transport().c_str(), p.free_blocks(), p.num_blocks(),
      double(p.block_bytes()) * p.num_layers() / 1024, r.requests_in_flight(),
      static_cast<unsigned long long>(c.requests_total()),
      static_cast<unsigned long long>(c.requests_ok()),
      static_cast<unsigned long long>(c.requests_failed()),
      static_cast<unsigned long long>(c.requests_cancelled()),
      static_cast<unsigned long long>(c.tokens_generated()), double(c.kv_bytes_moved()) / (1ull << 30),
      static_cast<unsigned long long>(c.handshakes()),
      static_cast<unsigned long long>(c.loads_recomputed()), r.quarantined_blocks(),
      static_cast<unsigned long long>(c.prompt_cache_hits()),
      static_cast<unsigned long long>(c.prompt_cache_misses()));
}
}  // namespace
#endif

int RunStats(std::span<const std::string> args) {
  std::vector<FlagSpec> specs = {
      {"decode", true, "decode daemon HOST:PORT", ""},
      {"prefill", true, "prefill daemon(s) HOST:PORT[,HOST:PORT...]", ""},
      {"json", false, "one JSON object per daemon (the StatsResponse) instead of a line", ""},
      {"deadline-ms", true, "deadline of each Stats call", "5000"},
  };
  for (auto& s : AuthFlagSpecs()) specs.push_back(s);
  auto flags = Flags::Parse(args, specs);
  if (!flags.ok()) return ReportError("stats", flags.status(), true);
  if (flags->help()) {
    std::cout << "usage: kvstream stats --decode HOST:PORT [--prefill HOST:PORT,...] [--json]\n"
              << FlagsHelp(specs);
    return kExitOk;
  }
#if KVSTREAM_CLI_HAVE_DAEMONS
  auto deadline_ms = flags->GetInt("deadline-ms", 1, 3600000);
  if (!deadline_ms.ok()) return ReportError("stats", deadline_ms.status(), true);
  if (!flags->Has("decode") && !flags->Has("prefill"))
    return ReportError("stats", InvalidArgument("give --decode and/or --prefill"), true);
  std::vector<std::pair<std::string, bool>> targets;  // address, is decode
  if (flags->Has("decode")) targets.emplace_back(flags->Get("decode"), true);
  if (flags->Has("prefill")) {
    for (const std::string& p : daemon::SplitPeers(flags->Get("prefill"))) {
      if (p.empty()) return ReportError("stats", InvalidArgument("--prefill: empty address"), true);
      targets.emplace_back(p, false);
    }
  }
  int rc = kExitOk;
  for (const auto& [address, is_decode] : targets) {
    auto r = is_decode ? StatsAt<v1::Decode>(*flags, address, *deadline_ms)
                       : StatsAt<v1::Prefill>(*flags, address, *deadline_ms);
    if (!r.ok()) {
      std::cerr << "kvstream stats: " << r.status().ToString() << "\n";
      rc = kExitFailed;
      continue;
    }
    if (flags->Has("json")) {
      std::string out;
      google::protobuf::util::JsonPrintOptions o;
      o.preserve_proto_field_names = true;  // the .proto's names (64-bit counters are strings)
#if GOOGLE_PROTOBUF_VERSION >= 5026000
      o.always_print_fields_with_no_presence = true;
#else
      o.always_print_primitive_fields = true;
#endif
      (void)google::protobuf::util::MessageToJsonString(*r, &out, o);
      std::printf("%s\n", out.c_str());
    } else {
      PrintLine(address, *r);
    }
  }
  return rc;
#else
  return ReportError("stats", NotSupported("this kvstream was built without the daemons' client "
                                           "(KVSTREAM_WITH_DAEMONS=OFF)"), false);
#endif
}

}  // namespace kvstream::cli
