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

// Connects `t` to the peer (`d`: its descriptor, or one made from it) and has the peer admit
// the connection: the endpoint's ticket goes to it over its stdin.
inline Result<std::unique_ptr<Endpoint>> ConnectAdmitted(Transport& t, RemotePeer& peer,
                                                        const PeerDescriptor& d) {
  auto ep = t.Connect(d);
  if (!ep.ok()) return ep;
  if (std::string ticket = (*ep)->AdmissionTicket(); !ticket.empty()) {
    if (!peer.process.WriteLine("ADMIT " + ToHex(ticket))) return Unavailable("peer gone");
    // Before the first write: a connection the peer has not admitted yet is refused.
    std::string line;
    if (!peer.process.ReadLine(&line, DeadlineAfterMs(10000))) return Unavailable("peer silent");
    if (line != "ADMITTED OK") return Internal("peer: " + line);
  }
  return ep;
}

}  // namespace kvstream::transport::test
