// Control-plane credentials of the daemons (docs/security.md, "Control plane authentication").
//
// Guarantees:
//  - With tls_cert/tls_key/tls_ca the server speaks TLS only and requires a client certificate
//    verified against tls_ca (mTLS); the decode dials its prefills over TLS presenting the same
//    pair. Certificate files are re-read every tls_reload_s seconds (gRPC's file watcher): a
//    replaced certificate is served without a restart.
//  - Authorizer::Check admits a call only with the identity its method needs: peer methods
//    (Handshake, Prefill, Cancel) a peer (the peer token, or a certificate named in
//    tls_peer_names); Generate, Stats and server reflection a client or a peer (the client
//    token, or any verified certificate). Tokens are compared in constant time; a refusal is UNAUTHENTICATED (no or
//    bad credential) or PERMISSION_DENIED (valid identity, wrong method), never echoing a secret.
//  - SecurityFromConfig refuses (kInvalidArgument, naming the keys) a listen or peer address off
//    loopback without credentials unless `insecure`; on loopback without credentials every call
//    is admitted, as before. The same for the metrics endpoint: off loopback it needs
//    metrics_auth_file unless `insecure`.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/status.h"
#include "daemon/daemon_config.h"

namespace kvstream::daemon {

enum class Method { kHandshake, kPrefill, kCancel, kGenerate, kStats, kReflection };

class Authorizer {
 public:
  struct Options {
    std::string peer_token;               // empty: no caller is a peer by token
    std::string client_token;             // empty: no caller is a client by token
    bool tls = false;                     // client certificates verified by the transport
    std::vector<std::string> peer_names;  // certificate CN / SAN values that are peers
  };
  // Admits every call (no credential configured).
  static std::shared_ptr<const Authorizer> Open();
  explicit Authorizer(Options options);

  grpc::Status Check(const grpc::ServerContext& ctx, Method method) const;
  // The authenticated peer identity of an admitted caller, what its sessions are bound to:
  // "cert:<name>" for a verified certificate that names a peer (its first name in peer_names),
  // else "token" for the peer token (one shared token is one identity), "" when calls are not
  // authenticated (no credential configured) or the caller is no peer.
  std::string PeerName(const grpc::ServerContext& ctx) const;
  bool open() const { return open_; }

 private:
  enum class Identity { kNone, kBadToken, kClient, kPeer };
  Authorizer() = default;
  Identity FromToken(const grpc::ServerContext& ctx) const;
  Identity FromCertificate(const grpc::ServerContext& ctx) const;

  bool open_ = true;
  Options options_;
};

// What one daemon's config asks for, built once at start.
struct Security {
  std::shared_ptr<grpc::ServerCredentials> server_credentials;  // insecure without TLS
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials;  // decode -> prefill
  std::string peer_token;  // the decode presents it to its prefills (empty: none)
  std::shared_ptr<const Authorizer> authorizer;
  // HTTP basic auth of the metrics endpoint (metrics_auth_file); empty = none.
  std::string metrics_user, metrics_password;
};
// role "prefill" or "decode". Reads the token files, checks the certificate files, applies the
// loopback / insecure rule.
Result<Security> SecurityFromConfig(const DaemonConfig& cfg, const std::string& role);

// Channel credentials for a client: TLS with tls_ca as root (and cert/key as client
// certificate when given), re-read every reload_s; insecure when tls_ca is empty.
Result<std::shared_ptr<grpc::ChannelCredentials>> ClientChannelCredentials(
    const std::string& tls_ca, const std::string& tls_cert, const std::string& tls_key,
    unsigned reload_s);
// A shared secret from a file: surrounding whitespace trimmed; unreadable, empty or shorter
// than 16 bytes is kInvalidArgument naming `key`.
Result<std::string> ReadTokenFile(const std::string& key, const std::string& path);
// host:port whose host is 127.0.0.0/8, ::1 or localhost, or a unix: socket path.
bool IsLoopbackAddress(std::string_view address);
// a == b without a data-dependent early exit.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace kvstream::daemon
