// The checks a Prefill request passes before it takes any resource: pure (no I/O, no server
// state), so they are unit-tested and fuzzed on their own (tests/prefill, tests/fuzz). The
// destination blocks are checked against the handshaken peer's pool by the connector (BeginSave).
#pragma once

#include "common/status.h"
#include "proto/kvstream.pb.h"

namespace kvstream::prefill {

// OK when the request has at least one token, at most max_position of them, and every token lies
// in [0, vocab_size); else kInvalidArgument saying which.
Status CheckPrefillRequest(const kvstream::v1::PrefillRequest& req, int vocab_size,
                           int max_position);

}  // namespace kvstream::prefill
