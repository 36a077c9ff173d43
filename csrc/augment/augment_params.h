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

// Columns of BatchAugment's per-sample uniform draws (exported as _C.AUGMENT_DRAW_COLUMNS; new draws
// go at the end, so that existing ones keep their values).
namespace draw {
inline constexpr int64_t kHflip = 0, kVflip = 1, kAngle = 2, kTranslate = 3 /* 2 */, kScale = 5, kShear = 6 /* 2 */,
                         kBrightness = 8, kContrast = 9, kSaturation = 10, kHue = 11, kOrder = 12 /* 4 */,
                         kGrayscale = 16, kCount = 17;
}  // namespace draw

// BatchAugment's ranges: flips and grayscale are probabilities, the rest (lo, hi) pairs; translate
// is (a, b) (fractions, uniform in [-a, a], [-b, b]), shear (x lo, x hi, y lo, y hi).
struct AugmentRanges {
  double hflip = 0, vflip = 0, grayscale = 0;
  double rotation[2] = {0, 0}, translate[2] = {0, 0}, scale[2] = {1, 1}, shear[4] = {0, 0, 0, 0};
  double brightness[2] = {1, 1}, contrast[2] = {1, 1}, saturation[2] = {1, 1}, hue[2] = {0, 0};
};

// Writable parameter arrays (AugmentParams' layout).
struct AugmentParamsOut {
  bool *hflip, *vflip;
  double *angle, *translate, *scale, *shear, *brightness, *contrast, *saturation, *hue;
  int64_t* order;
  bool* grayscale;
};

// BatchAugment's drawn parameters held in three blocks, each parameter a contiguous run of its
// block (sample_params' tensors are views of them, and the packing reads them in one call):
// floats [kDrawnFloats * n] (angle, translate [n, 2], scale, shear [n, 2], brightness, contrast,
// saturation, hue), flags [kDrawnFlags * n] (hflip, vflip, grayscale), order [n, 4].
inline constexpr int64_t kDrawnFloats = 10, kDrawnFlags = 3;
AugmentParamsOut drawn_params_out(int64_t n, double* floats, bool* flags, int64_t* order);
AugmentParams drawn_params(int64_t n, const double* floats, const bool* flags, const int64_t* order);

// The parameters from uniforms u[n * draw::kCount], as BatchAugment._params_from defines them with
// numpy (lo + (hi - lo) * u; a flip when u < p; ColorJitter's order a stable argsort of 4 draws):
// the same float64 operations, so the two are equal bit for bit (tests/test_augment.py).
void augment_params_from_uniforms(int64_t n, const double* u, const AugmentRanges& r, const AugmentParamsOut& out);

// Checks the values (check_augment_params), then writes float32 out[n * param::kCount].
void pack_augment_params(int64_t n, const AugmentParams& p, int64_t height, int64_t width, float* out);

}  // namespace gpupipe
