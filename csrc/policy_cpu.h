// Host kernels of the augmentation policies: one op slot of a batch, each sample with its own op
// (policy_ops.h's Kind) and parameter, uint8 [N, 3, H, W] in, uint8 out, any strides.
#pragma once

#include <stdint.h>

#include "policy_ops.h"

namespace gpupipe {

struct PolicyArgs {
  const uint8_t* input = nullptr;
  uint8_t* output = nullptr;
  int64_t n = 0, h = 0, w = 0;
  int64_t in_stride[4] = {0, 0, 0, 0};   // elements (bytes), N, C, H, W order
  int64_t out_stride[4] = {0, 0, 0, 0};
  const int32_t* kinds = nullptr;        // [n] policy::Kind
  const double* params = nullptr;        // [n] the kind's parameter (factor, bits, threshold)
  const float* matrices = nullptr;       // [n][6] inverse affine matrices (kAffine samples)
  int interpolation = 0;                 // 0 nearest, 1 bilinear (kAffine samples)
  const float* fill = nullptr;           // [3] fill outside the image, or null (torchvision's None)
};

// Two passes on the process's pool (inline when num_threads <= 1): per sample, the statistics its op
// needs (channel histograms, gray sum) and its lookup table; then every output row.
void policy_apply_cpu(const PolicyArgs& args, int num_threads);

}  // namespace gpupipe
