// Writer in this process, receiver in a child process (transport_peer), over a real backend.
#pragma once

#include <gtest/gtest.h>

#include <sstream>

#include "tests/transport/peer_process.h"
#include "tests/transport/test_util.h"
#include "transport/transport.h"

namespace kvstream::transport::test {

struct RemotePeer {
  PeerProcess process;
  PeerDescriptor descriptor;
};

// Starts transport_peer and reads its READY line; nullptr (with a test failure) otherwise.
// `tls` may end in "+alloc": the peer's region then comes from Transport::Allocate().
inline std::unique_ptr<RemotePeer> StartPeer(std::string tls, size_t region, size_t chunk) {
  auto peer = std::make_unique<RemotePeer>();
  std::vector<std::string> argv = {KVSTREAM_TRANSPORT_PEER_BIN, "ucx", "", std::to_string(region),
                                   std::to_string(chunk)};
  if (size_t plus = tls.find("+alloc"); plus != std::string::npos) {
    tls.erase(plus);
    argv.push_back("alloc");
  }
  argv[2] = tls.empty() ? "-" : tls;
  if (!peer->process.Start(argv)) {
    ADD_FAILURE() << "cannot start " << KVSTREAM_TRANSPORT_PEER_BIN;
    return nullptr;
  }
  std::string line;
  if (!peer->process.ReadLine(&line, DeadlineAfterMs(10000))) {
    ADD_FAILURE() << "peer did not get ready";
    return nullptr;
  }
  std::istringstream in(line);
  std::string tag, addr, key;
  uint64_t base = 0, len = 0;
  in >> tag >> addr >> base >> len >> key;
  if (tag != "READY") {
    ADD_FAILURE() << "unexpected peer line: " << line;
    return nullptr;
  }
  peer->descriptor.address = FromHex(addr);
  peer->descriptor.regions.push_back(RemoteRegion{base, len, FromHex(key)});
  return peer;
}

}  // namespace kvstream::transport::test
