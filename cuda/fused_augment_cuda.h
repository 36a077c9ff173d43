// Launcher of the fused augmentation CUDA kernel: plain pointers and a stream handle, no torch ABI.
#pragma once

#include <stdint.h>

namespace gpupipe {

struct FusedCudaArgs {
  const void* input = nullptr;
  bool input_is_uint8 = true;
  int64_t n = 0, h = 0, w = 0;
  int64_t in_stride[4] = {0, 0, 0, 0};  // elements, N, C, H, W
  const float* matrices = nullptr;     // device, n x 12
  const uint8_t* hflip = nullptr;      // device, n
  const uint8_t* vflip = nullptr;      // device, n
  void* output = nullptr;              // device, n x 3 x h x w
  int out_dtype = 0;
};

// Enqueues the kernel on `stream` (a cudaStream_t, e.g. torch's current stream); returns the
// cudaError_t of the launch (0 = success).
int fused_color_affine_cuda(const FusedCudaArgs& args, void* stream);
const char* cuda_error_string(int code);

}  // namespace gpupipe
