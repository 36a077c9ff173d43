// Launcher of the fused augmentation CUDA kernel: plain pointers and a stream handle, no torch ABI.
#pragma once

#include <stdint.h>

#include "fused_color.cuh"

namespace gpupipe {

// Enqueues the kernel on `stream` (a cudaStream_t, e.g. torch's current stream); returns the
// cudaError_t of the launch (0 = success). All pointers in args are device pointers.
int fused_color_affine_cuda(const fused::FusedArgs& args, void* stream);
const char* cuda_error_string(int code);

}  // namespace gpupipe
