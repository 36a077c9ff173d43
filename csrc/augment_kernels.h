// Launch arguments of the augmentation kernels, shared by their host build (augment_cpu.h) and the
// CUDA launchers (cuda/augment_cuda.h): plain pointers and sizes, validated by the bindings.
#pragma once

#include <stdint.h>

#include "augment_pixel.h"
#include "elem_type.h"

namespace gpupipe {

// A uint8 batch [n, 3, h, w] with any strides (elements = bytes).
struct Batch8 {
  const uint8_t* data = nullptr;
  int64_t n = 0, h = 0, w = 0;
  int64_t stride[4] = {0, 0, 0, 0};  // N, C, H, W

  GPUPIPE_HD pixel::Image8 sample(int64_t i) const {
    return pixel::Image8{data + i * stride[0], h, w, stride[1], stride[2], stride[3]};
  }
};

// warp_affine: out[i, :, y, x] = sample(input[i] at matrices[i] @ (x, y, 1)), same size as the input.
struct WarpArgs {
  Batch8 input;
  const float* matrices = nullptr;  // n x 6, row-major 2x3: output pixel -> input coordinate
  int interpolation = pixel::kNearest;
  pixel::Fill fill{false, {0.0f, 0.0f, 0.0f}};
  void* output = nullptr;  // [n, 3, h, w], any strides
  int out_type = kUInt8;   // kUInt8 (rounded as torchvision) or kFloat32 (0..255, unrounded)
  int64_t out_stride[4] = {0, 0, 0, 0};
};

}  // namespace gpupipe
