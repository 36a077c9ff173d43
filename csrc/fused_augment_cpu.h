// Host kernel of the fused augmentation (the CUDA kernel's per-pixel math, cuda/fused_color.cuh):
// uint8 or float input with any strides, per-sample 3x4 color matrix and flips, NCHW output in
// float32 / bfloat16 / float16, in one pass over the pixels.
#pragma once

#include <cstdint>

#include "../cuda/fused_color.cuh"

namespace gpupipe {

using fused::FusedArgs;

// Runs on the process's thread pool when num_threads > 1.
void fused_color_affine_cpu(const FusedArgs& args, int num_threads);

// Per-sample channel sums of the input (n x 3 doubles), for the contrast op's gray mean: one
// read-only pass, exact for uint8 input. Uses the input fields of args only.
void channel_sums_cpu(const FusedArgs& args, double* out, int num_threads);

}  // namespace gpupipe
