// Host kernel of the fused augmentation (the CUDA kernel's per-pixel math, cuda/fused_color.cuh):
// uint8 or float input with any strides, per-sample 3x4 color matrix and flips, NCHW output in
// float32 / bfloat16 / float16, in one pass over the pixels.
#pragma once

#include <cstdint>

namespace gpupipe {

struct FusedArgs {
  const void* input = nullptr;
  bool input_is_uint8 = true;          // else float32
  int64_t n = 0, h = 0, w = 0;
  int64_t in_stride[4] = {0, 0, 0, 0};  // elements, in N, C, H, W order
  const float* matrices = nullptr;     // n x 12
  const uint8_t* hflip = nullptr;      // n (0/1)
  const uint8_t* vflip = nullptr;      // n (0/1)
  void* output = nullptr;              // n x 3 x h x w, contiguous
  int out_dtype = 0;                   // fused::OutDType
};

// Runs on the process's thread pool when num_threads > 1.
void fused_color_affine_cpu(const FusedArgs& args, int num_threads);

// Per-sample channel sums of the input (n x 3 doubles), for the contrast op's gray mean: one
// read-only pass, exact for uint8 input. Uses the input fields of args only.
void channel_sums_cpu(const FusedArgs& args, double* out, int num_threads);

}  // namespace gpupipe
