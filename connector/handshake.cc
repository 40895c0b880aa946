#include "connector/handshake.h"

#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <random>
#include <sstream>

namespace kvstream::connector {

LayoutDescriptor MakeLayoutDescriptor(const model::ModelConfig& config, int block_size) {
  LayoutDescriptor d;
  d.layout = model::KvLayout{config.num_layers, config.num_kv_heads, config.head_dim, block_size,
                             config.kv_dtype};
  d.model_hash = config.hash();
  d.protocol_version = kProtocolVersion;
  d.model_name = config.name;
  return d;
}

namespace {
template <typename T>
std::string Differs(const char* field, const T& local, const T& peer) {
  std::ostringstream os;
  os << "handshake refused: " << field << " differs: local " << local << ", peer " << peer;
  return os.str();
}
}  // namespace

Status CheckCompatible(const LayoutDescriptor& local, const LayoutDescriptor& peer) {
  // Protocol first: with another version the remaining fields may not mean the same thing.
  if (local.protocol_version != peer.protocol_version)
    return FailedPrecondition(
        Differs("protocol_version", local.protocol_version, peer.protocol_version));
  const model::KvLayout& a = local.layout;
  const model::KvLayout& b = peer.layout;
  if (a.num_layers != b.num_layers)
    return FailedPrecondition(Differs("num_layers", a.num_layers, b.num_layers));
  if (a.num_kv_heads != b.num_kv_heads)
    return FailedPrecondition(Differs("num_kv_heads", a.num_kv_heads, b.num_kv_heads));
  if (a.head_dim != b.head_dim)
    return FailedPrecondition(Differs("head_dim", a.head_dim, b.head_dim));
  if (a.block_size != b.block_size)
    return FailedPrecondition(Differs("block_size", a.block_size, b.block_size));
  if (a.dtype != b.dtype)
    return FailedPrecondition(
        Differs("dtype", std::string(DTypeName(a.dtype)), std::string(DTypeName(b.dtype))));
  if (local.model_hash != peer.model_hash) {
    std::ostringstream os;
    os << "handshake refused: model_hash differs: local " << std::hex << local.model_hash << " ("
       << local.model_name << "), peer " << peer.model_hash << " (" << peer.model_name << ")";
    return FailedPrecondition(os.str());
  }
  return OkStatus();
}

void ToProto(const LayoutDescriptor& d, kvstream::v1::LayoutDescriptor* out) {
  out->set_num_layers(d.layout.num_layers);
  out->set_num_kv_heads(d.layout.num_kv_heads);
  out->set_head_dim(d.layout.head_dim);
  out->set_block_size(d.layout.block_size);
  out->set_dtype(std::string(DTypeName(d.layout.dtype)));
  out->set_model_hash(d.model_hash);
  out->set_protocol_version(d.protocol_version);
  out->set_model_name(d.model_name);
}

Result<LayoutDescriptor> FromProto(const kvstream::v1::LayoutDescriptor& p) {
  LayoutDescriptor d;
  if (!ParseDType(p.dtype(), &d.layout.dtype))
    return InvalidArgument("handshake: unknown dtype '" + p.dtype() + "'");
  if (p.num_layers() <= 0 || p.num_kv_heads() <= 0 || p.head_dim() <= 0 || p.block_size() <= 0)
    return InvalidArgument("handshake: layout fields must be positive");
  d.layout.num_layers = p.num_layers();
  d.layout.num_kv_heads = p.num_kv_heads();
  d.layout.head_dim = p.head_dim();
  d.layout.block_size = p.block_size();
  d.model_hash = p.model_hash();
  d.protocol_version = p.protocol_version();
  d.model_name = p.model_name();
  return d;
}

std::string NewInstanceId(const std::string& role) {
  std::random_device rd;
  uint64_t r = (uint64_t(rd()) << 32) ^ rd() ^ (uint64_t(getpid()) << 16);
  std::ostringstream os;
  os << role << "-" << std::hex << r;
  return os.str();
}

Result<std::string> NewSessionSecret() {
  std::string secret(kSessionSecretBytes, '\0');
  size_t got = 0;
  while (got < secret.size()) {
    const ssize_t n = getrandom(secret.data() + got, secret.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Internal(std::string("session secret: getrandom: ") + std::strerror(errno));
    }
    got += static_cast<size_t>(n);
  }
  return secret;
}

bool SecretsEqual(std::string_view a, std::string_view b) {
  // Every byte of `b` is read whatever the contents; a length mismatch is folded in last.
  unsigned char diff = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ static_cast<unsigned char>(b[i]));
  }
  volatile unsigned char sink = diff;
  return sink == 0 && a.size() == b.size();
}

}  // namespace kvstream::connector
