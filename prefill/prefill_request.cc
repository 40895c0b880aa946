#include "prefill/prefill_request.h"

#include <string>

namespace kvstream::prefill {

Status CheckPrefillRequest(const kvstream::v1::PrefillRequest& req, int vocab_size,
                           int max_position) {
  const int n = req.tokens_size();
  if (n == 0) return InvalidArgument("prefill: no tokens");
  if (n > max_position)
    return InvalidArgument("prefill: " + std::to_string(n) +
                           " tokens exceed the model's max_position " + std::to_string(max_position));
  if (req.cache_salt().size() > 256)
    return InvalidArgument("prefill: cache_salt over 256 bytes");
  for (int32_t t : req.tokens())
    if (t < 0 || t >= vocab_size)
      return InvalidArgument("token id " + std::to_string(t) + " outside the vocabulary [0, " +
                             std::to_string(vocab_size) + ")");
  return OkStatus();
}

}  // namespace kvstream::prefill
