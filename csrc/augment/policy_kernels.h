// Launch arguments of the policies' kernels, shared by their host build (policy_cpu.h) and the CUDA
// launcher (cuda/policy_cuda.h): plain pointers and sizes, validated by policy_args.h.
#pragma once

#include <stdint.h>

#include "augment/augment_kernels.h"
#include "augment/policy_ops.h"

namespace gpupipe {

struct PolicyArgs {
  Batch8 input;
  uint8_t* output = nullptr;              // [n, 3, h, w], any strides
  int64_t out_stride[4] = {0, 0, 0, 0};   // N, C, H, W
  int64_t slots = 1;                      // ops per sample, applied in order
  const int64_t* kinds = nullptr;         // [n][slots] policy::Kind
  const double* params = nullptr;         // [n][slots] the kind's parameter (factor, bits, threshold)
  const float* matrices = nullptr;        // [n][slots][6] output pixel -> input coordinate (kAffine)
  int interpolation = pixel::kNearest;    // kAffine samples
  pixel::Fill fill{false, {0.0f, 0.0f, 0.0f}};

  GPUPIPE_HD uint8_t* output_row(int64_t i, int64_t y) const { return output + i * out_stride[0] + y * out_stride[2]; }
};

// Device workspace of one CUDA launch: per sample, the channel histograms and gray sum (zeroed by the
// caller) and the lookup tables.
struct PolicyWorkspace {
  unsigned long long* hist = nullptr;     // [n][768], zeros
  unsigned long long* gray_sum = nullptr;  // [n], zeros
  uint8_t* luts = nullptr;                 // [n][768]
};

}  // namespace gpupipe
