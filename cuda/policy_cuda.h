// Launcher of the policies' CUDA kernels: plain pointers and a stream handle, no torch ABI.
#pragma once

#include <stdint.h>

#include "augment/policy_kernels.h"

namespace gpupipe {

// Device workspace of one launch: per sample, the channel histograms and gray sum (zeroed by the
// caller) and the lookup tables.
struct PolicyWorkspace {
  unsigned long long* hist = nullptr;     // [n][768], zeros
  unsigned long long* gray_sum = nullptr;  // [n], zeros
  uint8_t* luts = nullptr;                 // [n][768]
};

// Enqueues the statistics, table and pixel kernels on `stream` (a cudaStream_t); returns the
// cudaError_t of the launches (0 = success). All pointers are device pointers.
int policy_apply_cuda(const PolicyArgs& args, const PolicyWorkspace& work, void* stream);

}  // namespace gpupipe
