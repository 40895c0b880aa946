// Admission of the UCX backend's incoming connections (transport/ucx/): a ucp_listener's
// connection request is accepted only if Transport::Admit() named it before it arrived; every
// other one is refused at once with ucp_listener_reject (UCX 1.13 asserts when a request is
// left unanswered while its client's socket stays active, so none is held).
//
// Guarantees:
//  - A request is accepted only if its client id (the writer worker's random 64-bit id, sent in
//    the request) and its source address and port (the writer's socket, as the kernel here saw
//    it) equal those of an admitted ticket; a ticket admits one connection (the kMaxTickets
//    newest are kept). No UCX endpoint exists for a request before that, so nothing the client
//    sends after its request (puts, active messages) is processed before it.
//  - Every refusal is counted. With admit_any every request is accepted (benchmarks only).
//  - Accepted endpoints are closed when their peer fails and when the worker stops; the reply
//    endpoints riding on one (ReplyEndpoint, ucx_transport.h) then fail with kRemoteDisconnect
//    and stop using it.
//
// Everything but the counters runs on the worker's progress thread.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "transport/ucx/ucx_wire.h"

namespace kvstream::transport::ucx {

class UcxWorker;
struct UcxEndpointState;

class Admission {
 public:
  static constexpr size_t kMaxTickets = 64;

  Admission(UcxWorker* worker, bool admit_any) : worker_(worker), admit_any_(admit_any) {}

  // The listener's connection handler (arg: this Admission).
  static void OnConnRequest(ucp_conn_request_h request, void* arg);
  // Admits one connection matching `ticket`, when it arrives.
  void Expect(const UcxTicket& ticket);
  // Frees the closes that completed. False once nothing is left to watch.
  bool Tick();
  // Worker stopping: refuses what arrives from now on, closes every accepted endpoint.
  void Shutdown();
  // Force-closing endpoints whose close has not completed yet.
  bool closing() const { return !closing_.empty(); }
  // The open connection accepted for `ticket` (same client id, source address and port), or
  // nullptr.
  ucp_ep_h Find(const UcxTicket& ticket) const;
  // `reply` sends over the accepted `ep` (ReplyEndpoint): when that connection closes, it is
  // marked failed and detached from it.
  void AddReply(ucp_ep_h ep, const std::shared_ptr<UcxEndpointState>& reply);

  uint64_t admitted() const { return admitted_.load(); }
  uint64_t refused() const { return refused_.load(); }

 private:
  void Accept(ucp_conn_request_h request, const UcxTicket& from);
  void Refuse(ucp_conn_request_h request, const UcxTicket& from, const char* why);
  // Closes an accepted connection and detaches its reply endpoints.
  void CloseAccepted(ucp_ep_h ep);
  void Close(ucp_ep_h ep);
  void Watch();
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);

  UcxWorker* worker_;
  const bool admit_any_;
  bool stopped_ = false;
  std::vector<UcxTicket> expected_;  // oldest first
  struct Accepted {
    UcxTicket from;
    std::vector<std::weak_ptr<UcxEndpointState>> replies;
  };
  std::unordered_map<ucp_ep_h, Accepted> accepted_;
  std::vector<void*> closing_;  // ucp requests of endpoint closes in progress
  std::atomic<uint64_t> admitted_{0};
  std::atomic<uint64_t> refused_{0};
};

}  // namespace kvstream::transport::ucx
