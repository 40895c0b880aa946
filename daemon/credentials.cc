#include "daemon/credentials.h"

#include <arpa/inet.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "common/log.h"

namespace kvstream::daemon {
namespace {

constexpr std::string_view kBearer = "Bearer ";

const char* MethodName(Method m) {
  switch (m) {
    case Method::kHandshake: return "Prefill/Handshake";
    case Method::kPrefill: return "Prefill/Prefill";
    case Method::kCancel: return "Prefill/Cancel";
    case Method::kGenerate: return "Decode/Generate";
    case Method::kStats: return "Stats";
    case Method::kReflection: return "ServerReflection";
  }
  return "?";
}

bool IsPeerMethod(Method m) {
  return m == Method::kHandshake || m == Method::kPrefill || m == Method::kCancel;
}

std::string_view View(const grpc::string_ref& r) { return {r.data(), r.size()}; }

Result<std::string> ReadWholeFile(const std::string& key, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument(key + ": cannot read '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Status CheckPemFile(const std::string& key, const std::string& path) {
  KV_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(key, path));
  if (text.find("-----BEGIN ") == std::string::npos)
    return InvalidArgument(key + ": '" + path + "' holds no PEM block");
  return OkStatus();
}

void WarnIfShared(const std::string& key, const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    KV_LOG_WARN << key << ": '" << path << "' is readable by group or others (chmod 600)";
  }
}

}  // namespace

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i)
    diff = diff | static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

bool IsLoopbackAddress(std::string_view address) {
  if (address.rfind("unix:", 0) == 0) return true;  // a filesystem socket: its permissions rule
  for (std::string_view scheme : {"dns:///", "ipv4:", "ipv6:"})
    if (address.rfind(scheme, 0) == 0) address.remove_prefix(scheme.size());
  std::string host;
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    if (close == std::string_view::npos) return false;
    host = std::string(address.substr(1, close - 1));
  } else {
    const size_t colon = address.rfind(':');
    host = std::string(address.substr(0, colon));
  }
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

Result<std::string> ReadTokenFile(const std::string& key, const std::string& path) {
  KV_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(key, path));
  const char* ws = " \t\r\n";
  const size_t first = text.find_first_not_of(ws);
  if (first == std::string::npos) return InvalidArgument(key + ": '" + path + "' is empty");
  text = text.substr(first, text.find_last_not_of(ws) - first + 1);
  if (text.size() < 16)
    return InvalidArgument(key + ": the token in '" + path +
                           "' is shorter than 16 bytes (e.g. openssl rand -hex 32)");
  for (char c : text)
    if (static_cast<unsigned char>(c) < 0x21 || static_cast<unsigned char>(c) > 0x7e)
      return InvalidArgument(key + ": the token in '" + path +
                             "' must be printable ASCII without spaces (it travels as metadata)");
  WarnIfShared(key, path);
  return text;
}

std::shared_ptr<const Authorizer> Authorizer::Open() {
  static const std::shared_ptr<const Authorizer> open(new Authorizer());
  return open;
}

Authorizer::Authorizer(Options options) : open_(false), options_(std::move(options)) {}

Authorizer::Identity Authorizer::FromToken(const grpc::ServerContext& ctx) const {
  const auto& md = ctx.client_metadata();
  const auto it = md.find("authorization");
  if (it == md.end()) return Identity::kNone;
  std::string_view value = View(it->second);
  if (value.rfind(kBearer, 0) != 0) return Identity::kBadToken;
  value.remove_prefix(kBearer.size());
  // Both comparisons always run, so the time taken does not tell which one matched.
  const bool peer = !options_.peer_token.empty() && ConstantTimeEquals(options_.peer_token, value);
  const bool client =
      !options_.client_token.empty() && ConstantTimeEquals(options_.client_token, value);
  if (peer) return Identity::kPeer;
  if (client) return Identity::kClient;
  return Identity::kBadToken;
}

Authorizer::Identity Authorizer::FromCertificate(const grpc::ServerContext& ctx) const {
  const std::shared_ptr<const grpc::AuthContext> ac = ctx.auth_context();
  if (!ac || !ac->IsPeerAuthenticated()) return Identity::kNone;
  for (const grpc::AuthProperty& p : *ac) {
    const std::string_view name = View(p.first);
    if (name != GRPC_X509_CN_PROPERTY_NAME && name != GRPC_X509_SAN_PROPERTY_NAME) continue;
    for (const std::string& peer : options_.peer_names)
      if (View(p.second) == peer) return Identity::kPeer;
  }
  return Identity::kClient;
}

grpc::Status Authorizer::Check(const grpc::ServerContext& ctx, Method method) const {
  if (open_) return grpc::Status::OK;
  Identity id = FromToken(ctx);
  if (id == Identity::kBadToken) {
    KV_LOG_WARN << MethodName(method) << " from " << ctx.peer() << " refused: bad bearer token";
    return {grpc::StatusCode::UNAUTHENTICATED,
            std::string(MethodName(method)) + ": bearer token not accepted"};
  }
  if (options_.tls && id != Identity::kPeer) id = std::max(id, FromCertificate(ctx));
  if (id == Identity::kNone) {
    KV_LOG_WARN << MethodName(method) << " from " << ctx.peer() << " refused: no credential";
    return {grpc::StatusCode::UNAUTHENTICATED,
            std::string(MethodName(method)) +
                ": no credential (send 'authorization: Bearer <token>' or a client certificate)"};
  }
  if (IsPeerMethod(method) && id != Identity::kPeer) {
    KV_LOG_WARN << MethodName(method) << " from " << ctx.peer() << " refused: a client, not a peer";
    return {grpc::StatusCode::PERMISSION_DENIED,
            std::string(MethodName(method)) +
                " needs a peer identity (the peer token, or a certificate named in "
                "tls_peer_names); the caller is a client"};
  }
  return grpc::Status::OK;
}

std::string Authorizer::PeerName(const grpc::ServerContext& ctx) const {
  if (open_) return "";
  if (options_.tls) {
    const std::shared_ptr<const grpc::AuthContext> ac = ctx.auth_context();
    if (ac && ac->IsPeerAuthenticated()) {
      for (const std::string& peer : options_.peer_names) {
        for (const grpc::AuthProperty& p : *ac) {
          const std::string_view name = View(p.first);
          if ((name == GRPC_X509_CN_PROPERTY_NAME || name == GRPC_X509_SAN_PROPERTY_NAME) &&
              View(p.second) == peer) {
            return "cert:" + peer;
          }
        }
      }
    }
  }
  return FromToken(ctx) == Identity::kPeer ? "token" : "";
}

Result<std::shared_ptr<grpc::ChannelCredentials>> ClientChannelCredentials(
    const std::string& tls_ca, const std::string& tls_cert, const std::string& tls_key,
    unsigned reload_s) {
  if (tls_ca.empty()) {
    if (!tls_cert.empty() || !tls_key.empty())
      return InvalidArgument("a client certificate (tls_cert, tls_key) needs tls_ca");
    return grpc::InsecureChannelCredentials();
  }
  if (tls_cert.empty() != tls_key.empty())
    return InvalidArgument("tls_cert and tls_key go together");
  KV_RETURN_IF_ERROR(CheckPemFile("tls_ca", tls_ca));
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider;
  if (tls_cert.empty()) {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(tls_ca, reload_s);
  } else {
    KV_RETURN_IF_ERROR(CheckPemFile("tls_cert", tls_cert));
    KV_RETURN_IF_ERROR(CheckPemFile("tls_key", tls_key));
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        tls_key, tls_cert, tls_ca, reload_s);
  }
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (!tls_cert.empty()) options.watch_identity_key_cert_pairs();
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::experimental::TlsCredentials(options);
  if (!creds) return Internal("gRPC refused the TLS channel options");
  return creds;
}

Result<Security> SecurityFromConfig(const DaemonConfig& cfg, const std::string& role) {
  Security sec;
  const bool tls = !cfg.tls_ca.empty();  // Validate: all three or none
  Authorizer::Options ao;
  ao.tls = tls;
  for (const std::string& n : SplitPeers(cfg.tls_peer_names))
    if (!n.empty()) ao.peer_names.push_back(n);
  std::string peer_token, client_token;
  if (!cfg.peer_token_file.empty()) {
    KV_ASSIGN_OR_RETURN(peer_token, ReadTokenFile("peer_token_file", cfg.peer_token_file));
  }
  if (!cfg.client_token_file.empty()) {
    KV_ASSIGN_OR_RETURN(client_token, ReadTokenFile("client_token_file", cfg.client_token_file));
  }
  const bool decode = role == "decode";
  // The prefill admits peers by the peer token; the decode serves no peer method and presents
  // the peer token to its prefills.
  ao.peer_token = decode ? "" : peer_token;
  ao.client_token = client_token;
  if (decode) sec.peer_token = peer_token;

  const std::string set_tls = "set tls_cert, tls_key and tls_ca (mTLS)";
  const std::string or_insecure = ", or pass --insecure to run without authentication";
  if (!cfg.insecure && !IsLoopbackAddress(cfg.listen)) {
    if (!decode && !tls && ao.peer_token.empty())
      return InvalidArgument("listen " + cfg.listen + " is not a loopback address: " + set_tls +
                             " or peer_token_file" + or_insecure);
    if (decode && !tls && ao.client_token.empty())
      return InvalidArgument("listen " + cfg.listen + " is not a loopback address: " + set_tls +
                             " or client_token_file" + or_insecure);
  }
  if (decode && !cfg.http.empty() && !cfg.insecure && !IsLoopbackAddress(cfg.http) && !tls &&
      ao.client_token.empty())
    return InvalidArgument("http " + cfg.http + " is not a loopback address: " + set_tls +
                           " or client_token_file" + or_insecure);
  if (decode && !cfg.insecure && !tls && peer_token.empty()) {
    for (const std::string& p : SplitPeers(cfg.peer))
      if (!IsLoopbackAddress(p))
        return InvalidArgument("peer " + p + " is not a loopback address: " + set_tls +
                               " or peer_token_file" + or_insecure);
  }

  if (!cfg.metrics_auth_file.empty()) {
    KV_ASSIGN_OR_RETURN(std::string pair, ReadTokenFile("metrics_auth_file", cfg.metrics_auth_file));
    const size_t colon = pair.find(':');
    if (colon == std::string::npos || colon == 0 || pair.size() - colon - 1 < 16)
      return InvalidArgument("metrics_auth_file " + cfg.metrics_auth_file +
                             ": expected one line user:password, the password 16 bytes or more");
    sec.metrics_user = pair.substr(0, colon);
    sec.metrics_password = pair.substr(colon + 1);
  }
  if (!cfg.metrics.empty() && !cfg.insecure && !IsLoopbackAddress(cfg.metrics) &&
      sec.metrics_user.empty())
    return InvalidArgument("metrics " + cfg.metrics +
                           " is not a loopback address: set metrics_auth_file" + or_insecure);

  const unsigned reload_s = static_cast<unsigned>(cfg.tls_reload_s);
  if (tls) {
    KV_RETURN_IF_ERROR(CheckPemFile("tls_cert", cfg.tls_cert));
    KV_RETURN_IF_ERROR(CheckPemFile("tls_key", cfg.tls_key));
    KV_RETURN_IF_ERROR(CheckPemFile("tls_ca", cfg.tls_ca));
    WarnIfShared("tls_key", cfg.tls_key);
    auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        cfg.tls_key, cfg.tls_cert, cfg.tls_ca, reload_s);
    grpc::experimental::TlsServerCredentialsOptions options(provider);
    options.watch_root_certs();
    options.watch_identity_key_cert_pairs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    sec.server_credentials = grpc::experimental::TlsServerCredentials(options);
    if (!sec.server_credentials) return Internal("gRPC refused the TLS server options");
  } else {
    sec.server_credentials = grpc::InsecureServerCredentials();
  }
  KV_ASSIGN_OR_RETURN(sec.channel_credentials,
                      ClientChannelCredentials(cfg.tls_ca, cfg.tls_cert, cfg.tls_key, reload_s));
  const bool open = !tls && ao.peer_token.empty() && ao.client_token.empty();
  sec.authorizer = open ? Authorizer::Open() : std::make_shared<const Authorizer>(std::move(ao));
  KV_LOG_INFO << "control plane: " << (tls ? "mTLS" : "plaintext")
              << (open ? ", every caller admitted"
                       : std::string(", callers need ") +
                             (tls ? "a verified certificate" : "") +
                             (tls && !(peer_token.empty() && client_token.empty()) ? " or " : "") +
                             (peer_token.empty() && client_token.empty() ? "" : "a bearer token"))
              << (decode && !peer_token.empty() ? "; presenting the peer token to prefills" : "");
  return sec;
}

}  // namespace kvstream::daemon
