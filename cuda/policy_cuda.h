// Launcher of the policies' CUDA kernels: plain pointers and a stream handle, no torch ABI.
#pragma once

#include <stdint.h>

#include "augment/policy_kernels.h"

namespace gpupipe {

// Enqueues the statistics, table and pixel kernels of ONE op slot (args.slots == 1, checked by
// policy_workspace) on `stream` (a cudaStream_t); returns the cudaError_t of the launches
// (0 = success). All pointers are device pointers. A policy of S slots is S calls (policy_ops.cu).
int policy_apply_cuda(const PolicyArgs& args, const PolicyWorkspace& work, void* stream);

}  // namespace gpupipe
