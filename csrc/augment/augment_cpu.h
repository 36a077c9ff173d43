// Host kernels of gpupipe's augmentations: the per-pixel math of augment_pixel.h (shared with the
// CUDA kernels) run over a batch on the process's thread pool. Plain C++17, no Python.
#pragma once

#include "augment/augment_kernels.h"

namespace gpupipe {

void warp_affine_cpu(const WarpArgs& args, int num_threads);

// BatchAugment's engine: two passes over the input at most (contrast's image means, then the output).
void augment_cpu(const AugmentArgs& args, int num_threads);

}  // namespace gpupipe
