// Host kernel of MixUp's blend: out[i] = x[(i - 1) mod n] * (1 - lam) + x[i] * lam for each sample i
// of a float32 batch, in one pass (torchvision computes it as roll, mul_, mul, add_: four passes and
// two batch-sized temporaries). The rounding is torchvision's: each product rounded to float32, then
// their sum (this file is compiled with -ffp-contract=off: no fused multiply-add).
#pragma once

#include <stdint.h>

#include <vector>

namespace gpupipe {

// A checked blend: contiguous float32 images [N, C, H, W] (and out, of their shape, apart from them),
// lam within [0, 1].
struct MixArgs {
  float* images = nullptr;
  float* out = nullptr;  // null: in place
  int64_t n = 0, per_sample = 0;
  double lam = 0.0;
};

// From buffer descriptions (common/strided_buffer.h); `output` null: in place. Throws
// InvalidArgument naming the argument.
MixArgs mixup_args(const std::vector<int64_t>& images, const std::vector<int64_t>* output, double lam);

// x, out: n samples of `per_sample` contiguous floats each (out must not overlap x).
void mixup_rolled_cpu(const float* x, float* out, int64_t n, int64_t per_sample, double lam, int num_threads);

// The same blend written over x (MixUp(inplace=True)): the same values, no batch-sized output.
void mixup_rolled_inplace_cpu(float* x, int64_t n, int64_t per_sample, double lam, int num_threads);

}  // namespace gpupipe
