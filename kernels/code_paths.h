// Which code paths a launch takes: the sm_90 (Hopper) paths, or those of the GPUs before it.
// The decode attention and the sampling kernels decide the same way, from these two calls.
#pragma once

namespace kvstream::kernels {

// True when KVSTREAM_KERNEL_FALLBACK is set to anything but "" or "0": every launch takes the
// paths of pre-Hopper GPUs (to test them on a Hopper GPU). Read once per process.
bool FallbackForced();

// Whether device `dev` can run the sm_90 paths of `kernel` (a __global__ function): compute
// capability >= 9.0 and the image of `kernel` that the runtime loaded for the device compiled
// for compute_90 or later (the sm_90a code, or compute_90 PTX that the driver compiled for a
// newer GPU). False on any CUDA error. Asks the driver each call: callers keep the answer.
bool DeviceRunsHopperCode(int dev, const void* kernel);

}  // namespace kvstream::kernels
