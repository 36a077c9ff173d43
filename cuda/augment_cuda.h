// Launchers of the augmentation CUDA kernels: plain pointers and a stream handle, no torch ABI.
// Each enqueues on `stream` (a cudaStream_t, e.g. torch's current stream) and returns the
// cudaError_t of the launch (0 = success). All pointers in the arguments are device pointers.
#pragma once

#include "augment/augment_kernels.h"

namespace gpupipe {

int warp_affine_cuda(const WarpArgs& args, void* stream);

// BatchAugment's engine: one fused launch on sm_90 for samples whose state fits a cluster's shared
// memory; otherwise two launches, contrast's image means (partial sums into args.mean_partials),
// then the output.
int augment_cuda(const AugmentArgs& args, void* stream);

}  // namespace gpupipe
