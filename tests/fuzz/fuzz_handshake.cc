// Fuzzes what a prefill reads from a Handshake call before it touches the data plane: the
// HandshakeRequest protobuf, its layout descriptor (connector::FromProto, CheckCompatible) and
// the UCX address and memory keys it carries (transport/ucx/ucx_wire.h).
// A descriptor that parses must write back (ToProto) to one that parses to the same fields.
#include <cstdint>
#include <string>

#include <google/protobuf/stubs/logging.h>

#include "connector/handshake.h"
#include "proto/kvstream.pb.h"
#include "tests/fuzz/fuzz_util.h"
#include "transport/ucx/ucx_wire.h"

// Invalid UTF-8 in string fields is an expected input, not worth a log line per run.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvstream;
  v1::HandshakeRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  auto peer = connector::FromProto(req.layout());
  if (peer.ok()) {
    v1::LayoutDescriptor written;
    connector::ToProto(*peer, &written);
    auto again = connector::FromProto(written);
    if (!again.ok() || connector::CheckCompatible(*peer, *again).ok() != true ||
        again->protocol_version != peer->protocol_version)
      fuzz::Fail("layout descriptor does not read back");
    auto tiny = model::PresetConfig("tiny");
    const auto local = connector::MakeLayoutDescriptor(*tiny, 16);
    (void)connector::CheckCompatible(local, *peer);
  }
  (void)transport::ucx::DecodeAddress(req.transport_address());
  for (const auto& r : req.regions()) (void)transport::ucx::DecodeKey(r.key(), "region key");
  return 0;
}
