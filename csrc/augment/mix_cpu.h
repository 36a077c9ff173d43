// Host kernel of MixUp's blend: out[i] = x[(i - 1) mod n] * (1 - lam) + x[i] * lam for each sample i
// of a float32 batch, in one pass (torchvision computes it as roll, mul_, mul, add_: four passes and
// two batch-sized temporaries). The rounding is torchvision's: each product rounded to float32, then
// their sum (this file is compiled with -ffp-contract=off: no fused multiply-add).
#pragma once

#include <stdint.h>

namespace gpupipe {

// x, out: n samples of `per_sample` contiguous floats each (out must not overlap x).
void mixup_rolled_cpu(const float* x, float* out, int64_t n, int64_t per_sample, double lam, int num_threads);

// The same blend written over x (MixUp(inplace=True)): the same values, no batch-sized output.
void mixup_rolled_inplace_cpu(float* x, int64_t n, int64_t per_sample, double lam, int num_threads);

}  // namespace gpupipe
