// BatchAugment's per-sample parameters -> the engine's rows (augment_kernels.h, namespace param),
// on the host, once per batch: a few microseconds for 256 samples, where the same as torch ops on
// small tensors cost more than the CUDA kernel's whole batch.
#pragma once

#include <cstdint>

namespace gpupipe {

// torchvision's affine parameters per sample (float64 rows; flips bool), as BatchAugment and
// gpupipe.augment.affine_matrices take them.
struct AffineParams {
  const double* angle = nullptr;      // [n], torchvision affine's sign convention
  const double* translate = nullptr;  // [n, 2] pixels (x, y)
  const double* scale = nullptr;      // [n], > 0
  const double* shear = nullptr;      // [n, 2] degrees (x, y)
  const double* center = nullptr;     // [n, 2], torchvision's convention (the top-left corner at 0, 0)
  const bool* hflip = nullptr;        // [n], flips that follow the affine
  const bool* vflip = nullptr;
};

// Row i of out (2x3, row-major): output pixel (x, y) -> input coordinate, in pixel-index
// coordinates (the derivation: gpupipe/augment/affine_matrix.py). torchvision's
// _get_inverse_affine_matrix with libm's cos / sin / tan, as its own math module calls them.
void inverse_affine(int64_t n, const AffineParams& p, int64_t height, int64_t width, double* out);

// BatchAugment's parameters (its PARAM_KEYS), color = "torchvision".
struct AugmentParams {
  const bool* hflip = nullptr;        // [n]
  const bool* vflip = nullptr;        // [n]
  const double* angle = nullptr;      // [n] degrees, counter-clockwise
  const double* translate = nullptr;  // [n, 2] fractions of (W, H)
  const double* scale = nullptr;      // [n]
  const double* shear = nullptr;      // [n, 2] degrees
  const double* brightness = nullptr; // [n]
  const double* contrast = nullptr;   // [n]
  const double* saturation = nullptr; // [n]
  const double* hue = nullptr;        // [n] turns
  const int64_t* order = nullptr;     // [n, 4] permutations of 0..3
  const bool* grayscale = nullptr;    // [n]
};

// Throws InvalidArgument naming the first parameter with a value BatchAugment cannot apply (not
// finite, a negative factor, |hue| > 0.5, scale <= 0, |shear| >= 90, an order that is not a
// permutation): BatchAugment.check_params's messages.
void check_augment_params(int64_t n, const AugmentParams& p);

// Checks the values (check_augment_params), then writes float32 out[n * param::kCount].
void pack_augment_params(int64_t n, const AugmentParams& p, int64_t height, int64_t width, float* out);

}  // namespace gpupipe
