// Test support: a one-thread kernel that keeps a stream busy for `ns` nanoseconds of GPU wall
// time (%globaltimer), to hold back work queued behind it without involving any host thread.
#pragma once

#include <cuda_runtime_api.h>

namespace kvstream::testing {
cudaError_t LaunchSpin(cudaStream_t stream, unsigned long long ns);
}  // namespace kvstream::testing
