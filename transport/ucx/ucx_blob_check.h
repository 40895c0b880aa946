// Checks of UCX's own blobs from a peer (a packed worker address, a packed rkey) before they
// reach UCX, whose parsers (UCX 1.13: ucp_address_unpack, ucp_ep_rkey_unpack) read them without
// bounds checks and assert on what they do not expect, aborting the process.
//
// Each check walks the blob as that parser would and refuses (kInvalidArgument naming `what`)
// anything it would read past the end of, stop short of the end of, or assert on: an address
// version UCX does not speak, more resources or memory domains than UCX handles, endpoint
// addresses inside a worker address. A blob that passes is well-formed, not trusted: its
// content (which interfaces, which keys) is still the peer's word. The worker-address layout is
// the non-unified one (the worker is created with UNIFIED_MODE=n for this), of UCX 1.13 (same
// constants and order up to 1.18): both ends should run the same UCX release.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace kvstream::transport::ucx {

// Upper bounds on what a peer may send (far above what UCX 1.13 packs on any host seen).
inline constexpr size_t kMaxWorkerAddressBytes = 16 << 10;
inline constexpr size_t kMaxPackedRkeyBytes = 4 << 10;

Status CheckWorkerAddress(std::string_view address, const std::string& what);
Status CheckPackedRkey(std::string_view rkey, const std::string& what);

}  // namespace kvstream::transport::ucx
