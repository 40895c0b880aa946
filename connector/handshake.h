// The handshake's layout descriptor: what prefill and decode must agree on before any KV moves,
// and the protocol constants both sides use.
//
// Guarantees:
//  - CheckCompatible() compares every field and refuses the first mismatch with
//    kFailedPrecondition whose message names the field and both values
//    ("handshake refused: block_size differs: local 16, peer 32").
//  - kProtocolVersion changes whenever the meaning of the wire changes; proto fields are only
//    ever added.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/dtype.h"
#include "common/status.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "proto/kvstream.pb.h"

namespace kvstream::connector {

inline constexpr uint32_t kProtocolVersion = 1;

// Trailing metadata of a Prefill call (value "1"): the prefill sets it once none of the call's
// writes can still land in the decode's pool, so the decode may reuse the blocks at once.
inline constexpr char kQuiescedTrailer[] = "kvstream-writes-quiesced";

struct LayoutDescriptor {
  model::KvLayout layout;
  uint64_t model_hash = 0;
  uint32_t protocol_version = kProtocolVersion;
  std::string model_name;  // informational, not compared
};

LayoutDescriptor MakeLayoutDescriptor(const model::ModelConfig& config, int block_size);

Status CheckCompatible(const LayoutDescriptor& local, const LayoutDescriptor& peer);

void ToProto(const LayoutDescriptor& d, kvstream::v1::LayoutDescriptor* out);
// kInvalidArgument on an unknown dtype name or non-positive shape fields.
Result<LayoutDescriptor> FromProto(const kvstream::v1::LayoutDescriptor& p);

// A random 64-bit identity (hex) for this process start, used as decode/prefill instance id.
// Public (Stats and logs print it): it names a peer, it never proves to be one.
std::string NewInstanceId(const std::string& role);

// Session secrets (proto HandshakeRequest.session_secret): what proves a decode instance to its
// prefill. kSessionSecretBytes bytes from the kernel's CSPRNG (getrandom(2)); kInternal if it
// cannot be read (never a weaker fallback).
inline constexpr size_t kSessionSecretBytes = 32;
inline constexpr size_t kMaxSessionSecretBytes = 1024;
Result<std::string> NewSessionSecret();
// Equality in time that depends only on the lengths, never on where the bytes differ.
bool SecretsEqual(std::string_view a, std::string_view b);

}  // namespace kvstream::connector
