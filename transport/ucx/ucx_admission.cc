#include "transport/ucx/ucx_admission.h"

#include <sys/socket.h>

#include <algorithm>

#include "common/log.h"
#include "transport/ucx/ucx_worker.h"
#include "transport/ucx/ucx_writer.h"

namespace kvstream::transport::ucx {

void Admission::OnConnRequest(ucp_conn_request_h request, void* arg) {
  auto* a = static_cast<Admission*>(arg);
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR | UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ID;
  UcxTicket from;
  if (ucp_conn_request_query(request, &attr) != UCS_OK) {
    return a->Refuse(request, from, "its request could not be read");
  }
  from.client_id = attr.client_id;
  from.source = ToWire(reinterpret_cast<const sockaddr*>(&attr.client_address));
  if (a->stopped_) return a->Refuse(request, from, "the transport is stopping");
  if (a->admit_any_) return a->Accept(request, from);
  for (auto it = a->expected_.begin(); it != a->expected_.end(); ++it) {
    if (it->client_id == from.client_id && SameEndpoint(it->source, from.source)) {
      a->expected_.erase(it);
      return a->Accept(request, from);
    }
  }
  a->Refuse(request, from, "no admitted handshake names it");
}

void Admission::Expect(const UcxTicket& ticket) {
  if (expected_.size() >= kMaxTickets) expected_.erase(expected_.begin());
  expected_.push_back(ticket);
}

void Admission::Accept(ucp_conn_request_h request, const UcxTicket& from) {
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.conn_request = request;
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = &Admission::OnEndpointError;
  p.err_handler.arg = this;
  ucp_ep_h ep = nullptr;
  const ucs_status_t st = ucp_ep_create(worker_->worker(), &p, &ep);
  if (st != UCS_OK) {
    ++refused_;
    KV_LOG_WARN << "ucx: accepting the admitted connection from " << ToString(from.source)
                << " failed: " << ucs_status_string(st);
    return;
  }
  accepted_[ep].from = from;
  ++admitted_;
  KV_LOG_DEBUG << "ucx: admitted the connection from " << ToString(from.source);
}

void Admission::Refuse(ucp_conn_request_h request, const UcxTicket& from, const char* why) {
  const uint64_t n = ++refused_;
  ucp_listener_reject(worker_->listener(), request);
  // A flood must not flood the log: the first ten, then every power of two.
  if (n <= 10 || (n & (n - 1)) == 0) {
    KV_LOG_WARN << "ucx: refused a connection from " << ToString(from.source) << ": " << why
                << " (" << n << " refused so far)";
  }
}

void Admission::OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t) {
  auto* a = static_cast<Admission*>(arg);
  // Not inside UCX's callback: closed on the next turn of the progress loop.
  a->worker_->Post([a, ep] { a->CloseAccepted(ep); });
}

ucp_ep_h Admission::Find(const UcxTicket& ticket) const {
  for (const auto& [ep, a] : accepted_) {
    if (a.from.client_id == ticket.client_id && SameEndpoint(a.from.source, ticket.source)) return ep;
  }
  return nullptr;
}

void Admission::AddReply(ucp_ep_h ep, const std::shared_ptr<UcxEndpointState>& reply) {
  auto it = accepted_.find(ep);
  if (it == accepted_.end()) return;
  auto& r = it->second.replies;
  r.erase(std::remove_if(r.begin(), r.end(), [](const auto& w) { return w.expired(); }), r.end());
  r.push_back(reply);
}

void Admission::CloseAccepted(ucp_ep_h ep) {
  auto it = accepted_.find(ep);
  if (it == accepted_.end()) return;
  for (const auto& w : it->second.replies) {
    if (auto r = w.lock()) {
      r->MarkFailed(RemoteDisconnect("ucx: the writer's connection closed"));
      r->ep = nullptr;  // sends nothing more over it (progress thread, like every use)
    }
  }
  accepted_.erase(it);
  Close(ep);
}

void Admission::Close(ucp_ep_h ep) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
  if (UCS_PTR_IS_PTR(r)) {
    closing_.push_back(r);
    Watch();
  }
}

bool Admission::Tick() {
  for (auto it = closing_.begin(); it != closing_.end();) {
    if (ucp_request_check_status(*it) == UCS_INPROGRESS) {
      ++it;
      continue;
    }
    ucp_request_free(*it);
    it = closing_.erase(it);
  }
  return !closing_.empty();
}

void Admission::Watch() {
  worker_->watchers[this] = [this] { return !Tick(); };
}

void Admission::Shutdown() {
  stopped_ = true;
  expected_.clear();
  std::vector<ucp_ep_h> open;
  for (const auto& [ep, a] : accepted_) open.push_back(ep);
  for (ucp_ep_h ep : open) CloseAccepted(ep);
}

}  // namespace kvstream::transport::ucx
