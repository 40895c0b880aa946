// kvstream kv-store: the shared KV tier (L4) on Redis without a daemon (docs/kv_store.md).
//
//   kvstream kv-store probe --redis A[,B...] (--auth-file F | --insecure) [--namespace NS]
//   kvstream kv-store erase --redis A[,B...] (--auth-file F | --insecure) [--namespace NS]
//
// probe: connects to every server, AUTHs and PINGs it; one line per server, exit 1 if any
// failed. erase: removes every key under "<NS>:" on every server (SCAN + UNLINK; other keys
// stay) and prints how many.
#include <iostream>

#include "cli/commands.h"
#include "cli/flags.h"
#include "kvcache/redis_store.h"

namespace kvstream::cli {

int RunKvStore(std::span<const std::string> args) {
  const std::vector<FlagSpec> specs = {
      {"redis", true, "Redis servers, unix:/path or host:port, comma-separated", ""},
      {"auth-file", true, "AUTH file: the password, or ACL user and password on two lines", ""},
      {"insecure", false, "no AUTH (a server without a password)", ""},
      {"namespace", true, "the daemons' kv_store_namespace", "kvstream"},
      {"timeout-ms", true, "deadline of each call", "2000"},
  };
  const std::string usage =
      "usage: kvstream kv-store probe|erase --redis A[,B...] (--auth-file F | --insecure) "
      "[--namespace NS]\n";
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    std::cout << usage << FlagsHelp(specs);
    return kExitOk;
  }
  if (args.empty() || (args[0] != "probe" && args[0] != "erase")) {
    std::cerr << usage;
    return kExitUsage;
  }
  const std::string action = args[0];
  auto flags = Flags::Parse(args.subspan(1), specs);
  if (!flags.ok()) return ReportError("kv-store", flags.status(), true);
  if (flags->help()) {
    std::cout << usage << FlagsHelp(specs);
    return kExitOk;
  }
  auto timeout = flags->GetInt("timeout-ms", 1, 3600000);
  if (!timeout.ok()) return ReportError("kv-store", timeout.status(), true);
  kvcache::RedisStoreOptions o;
  o.servers = kvcache::SplitRedisServers(flags->Get("redis"));
  o.auth_file = flags->Get("auth-file");
  o.insecure = flags->Has("insecure");
  o.ns = flags->Get("namespace");
  o.timeout = std::chrono::milliseconds(*timeout);
  auto store = kvcache::RedisStore::Open(o);
  if (!store.ok()) return ReportError("kv-store", store.status(), true);
  if (action == "probe") {
    int failed = 0;
    for (const auto& ep : (*store)->servers()) {
      o.servers = {ep.ToString()};
      auto one = kvcache::RedisStore::Open(o);
      const Status st = one.ok() ? (*one)->Probe() : one.status();
      std::cout << ep.ToString() << ": " << (st.ok() ? "ok" : st.ToString()) << "\n";
      failed += st.ok() ? 0 : 1;
    }
    return failed == 0 ? kExitOk : kExitFailed;
  }
  auto erased = (*store)->EraseAll();
  if (!erased.ok()) return ReportError("kv-store", erased.status(), false);
  std::cout << "erased " << *erased << " keys under '" << o.ns << ":' on "
            << (*store)->servers().size() << " server(s)\n";
  return kExitOk;
}

}  // namespace kvstream::cli
