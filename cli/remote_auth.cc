// The remote commands' credentials: --tls-ca/--tls-cert/--tls-key (mTLS) and --token-file (the
// client token as "authorization: Bearer ..."), docs/security.md.
#include "cli/remote.h"

#if KVSTREAM_CLI_HAVE_DAEMONS
#include "connector/client_auth.h"
#include "daemon/credentials.h"
#endif

namespace kvstream::cli {

std::vector<FlagSpec> AuthFlagSpecs() {
  return {
      {"tls-ca", true, "PEM CA that signed the daemons' certificates (TLS)", ""},
      {"tls-cert", true, "PEM client certificate (mTLS; with --tls-key)", ""},
      {"tls-key", true, "PEM private key of --tls-cert", ""},
      {"token-file", true, "file with the client token (sent as a bearer token)", ""},
  };
}

#if KVSTREAM_CLI_HAVE_DAEMONS
Result<std::shared_ptr<grpc::Channel>> RemoteChannel(const Flags& flags, const std::string& address) {
  connector::ClientAuth auth;
  KV_ASSIGN_OR_RETURN(auth.credentials,
                      daemon::ClientChannelCredentials(flags.Get("tls-ca"), flags.Get("tls-cert"),
                                                       flags.Get("tls-key"), /*reload_s=*/3600));
  if (flags.Has("token-file")) {
    KV_ASSIGN_OR_RETURN(auth.bearer_token, daemon::ReadTokenFile("--token-file", flags.Get("token-file")));
  }
  // Calls spread over every address the target resolves to (dns:///name:port with one address
  // per decode, or ipv4:a:p,b:q); one address: the same as pick_first.
  grpc::ChannelArguments args;
  args.SetLoadBalancingPolicyName("round_robin");
  return connector::CreateAuthChannel(address, auth, args);
}
#endif

}  // namespace kvstream::cli
