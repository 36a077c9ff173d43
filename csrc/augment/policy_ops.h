// Per-pixel math of the augmentation policies (TrivialAugmentWide, RandAugment, AutoAugment), shared
// by the host kernels (policy_cpu.cpp) and the CUDA kernels (cuda/policy_ops.cu), so the GPU's
// arithmetic is tested on machines without one.
//
// Every op reproduces torchvision.transforms.v2.functional on a uint8 image, float32 step by step:
// torch computes `a.add_(b, alpha=s)` as one fused multiply-add (vectorised fmadd) and converts the
// clamped float result to uint8 by truncation, and so do these functions.
#pragma once

#include <stdint.h>

#include <cmath>

#include "common/host_device.h"

namespace gpupipe {
namespace policy {

// What one sample undergoes in one op slot. The geometric ops (shear, translate, rotate) are all
// kAffine: Python folds each into the sample's 2x3 inverse matrix. Exported to Python as a dict
// (_C.policy_kinds(), from kKindNames below), the one definition of these numbers.
enum Kind : int32_t {
  kIdentity = 0,
  kBrightness = 1,    // param: factor
  kColor = 2,         // param: saturation factor
  kContrast = 3,      // param: factor
  kSharpness = 4,     // param: factor
  kPosterize = 5,     // param: bits
  kSolarize = 6,      // param: threshold (0..255 scale)
  kAutoContrast = 7,
  kEqualize = 8,
  kInvert = 9,
  kAffine = 10,       // the sample's 2x3 matrix
  // param: factor. Contrast of a 1-channel image read as three equal channels: torchvision blends
  // a 1-channel image with the mean of its levels, not of the 3-channel gray level (0.9999 of them,
  // floored). From channel 0's histogram, so it folds into a run of table ops as equalize does.
  kContrastGray = 11,
  kNumKinds = 12,
};

// The kinds' names, as _C.policy_kinds() gives them.
struct KindName {
  const char* name;
  Kind kind;
};
constexpr KindName kKindNames[] = {
    {"identity", kIdentity}, {"brightness", kBrightness}, {"color", kColor}, {"contrast", kContrast},
    {"sharpness", kSharpness}, {"posterize", kPosterize}, {"solarize", kSolarize},
    {"autocontrast", kAutoContrast}, {"equalize", kEqualize}, {"invert", kInvert}, {"affine", kAffine},
    {"contrast_gray", kContrastGray}};
static_assert(sizeof(kKindNames) / sizeof(kKindNames[0]) == kNumKinds, "a policy kind has no name");

// Kinds that are a per-sample, per-channel lookup table over the 256 input levels.
GPUPIPE_HD bool is_lut_kind(int32_t k) {
  return k == kIdentity || k == kBrightness || k == kContrast || k == kPosterize ||
         k == kSolarize || k == kAutoContrast || k == kEqualize || k == kInvert || k == kContrastGray;
}
GPUPIPE_HD bool needs_histogram(int32_t k) { return k == kEqualize || k == kContrastGray; }
GPUPIPE_HD bool needs_range(int32_t k) { return k == kAutoContrast; }  // per-channel min and max
GPUPIPE_HD bool needs_gray_sum(int32_t k) { return k == kContrast; }
// Kinds whose params entry is read: a factor, posterize's bits or solarize's threshold.
GPUPIPE_HD bool reads_param(int32_t k) {
  return k == kBrightness || k == kColor || k == kContrast || k == kSharpness || k == kPosterize || k == kSolarize ||
         k == kContrastGray;
}

// a * b + c rounded once, as torch's vectorised fmadd. Host: glibc's fma (hardware where the CPU
// has it); used where the operands need all of float's bits (the LUT builders, a few per sample).
GPUPIPE_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// a * b + c rounded once, for per-pixel loops. Host code built with FMA instructions (kHardware:
// the policies' "avx2,fma" row kernels) uses them; else the value goes through double, which is
// exact (hence equal) when it spans at most 53 bits: here a is an integer below 512 in magnitude,
// |b| < 1, c < 2^10, and b (the gray weights, 1 - factor) is 0 or at least 2^-19, which holds for
// the policies' magnitudes (|1 - factor| >= 1/30 unless 0). Plain arithmetic, so loops vectorise.
template <bool kHardware = false>
GPUPIPE_HD float fma_small(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  if constexpr (kHardware) return __builtin_fmaf(a, b, c);
  return static_cast<float>(static_cast<double>(a) * static_cast<double>(b) + static_cast<double>(c));
#endif
}

// torch's `.clamp_(0, 255).to(torch.uint8)`: clamp, then truncate toward zero. Truncating first and
// clamping the integer gives the same value for |v| < 2^31 (the bindings bound every factor so that
// the values stay far below), and vectorises into integer min / max: a float clamp before the
// conversion was compiled into compare-and-select chains, twice as slow.
GPUPIPE_HD uint8_t clamp_trunc_u8(float v) {
  const int32_t i = static_cast<int32_t>(v);
  return static_cast<uint8_t>(i < 0 ? 0 : (i > 255 ? 255 : i));
}
constexpr double kMaxFactor = 65536.0;  // |param| bound of the factor ops, checked at the bindings

// floor of torchvision's gray level r * 0.2989 + g * 0.587 + b * 0.114
// (`r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114)`, then `.floor_()`).
// The level is never negative, so the floor is a truncation (vectorised, no libm call).
template <bool kHardware = false>
GPUPIPE_HD float gray_floor(float r, float g, float b) {
  const float t = r * 0.2989f;
  const float u = fma_small<kHardware>(g, 0.587f, t);
  const float v = fma_small<kHardware>(b, 0.114f, u);
  return static_cast<float>(static_cast<int32_t>(v));
}

// torchvision's `_blend(image, other, ratio)` for one uint8 value and the other image's float value:
// `image.mul(ratio).add_(other, alpha=1 - ratio).clamp_(0, 255).to(uint8)`.
struct Blend {
  float ratio = 1.0f;  // float(ratio)
  float alpha = 0.0f;  // float(1.0 - ratio), computed in double as Python does
};
GPUPIPE_HD Blend make_blend(double ratio) {
  Blend b;
  b.ratio = static_cast<float>(ratio);
  b.alpha = static_cast<float>(1.0 - ratio);
  return b;
}
template <bool kHardware = false>
GPUPIPE_HD uint8_t blend_pixel(const Blend& b, float value, float other) {
  return clamp_trunc_u8(fma_small<kHardware>(other, b.alpha, value * b.ratio));
}

// adjust_sharpness at an interior pixel: the 3x3 blur (1s around a 5, over 13) rounded half to
// even, which for integer input is exactly round(sum / 13) (a sum over 13 is never a half), then
// `x + (1 - factor) * (blur - x)` as one fused multiply-add. sum9 is the plain sum of the 3x3 window.
template <bool kHardware = false>
GPUPIPE_HD uint8_t sharpen_pixel(int32_t sum9, int32_t center, float alpha) {
  const int32_t s = sum9 + 4 * center;
  const int32_t blur = (2 * s + 13) / 26;
  return clamp_trunc_u8(fma_small<kHardware>(static_cast<float>(blur - center), alpha, static_cast<float>(center)));
}

// The point ops that need no statistics and treat the channels alike, one level at a time: they fill
// these kinds' lookup tables, and the host kernel also evaluates them straight over contiguous
// bytes (the same function, so the same values; the loop vectorises where a table lookup cannot).
GPUPIPE_HD bool is_direct_kind(int32_t k) {
  return k == kBrightness || k == kPosterize || k == kSolarize || k == kInvert;
}
GPUPIPE_HD uint8_t brightness_level(uint8_t v, float factor) {  // image.mul(factor).clamp_(0, 255).to(uint8)
  return clamp_trunc_u8(static_cast<float>(v) * factor);
}
GPUPIPE_HD uint8_t posterize_mask(double bits) {  // image & mask, identity from 8 bits
  const int b = bits > 0.0 ? static_cast<int>(bits < 8.0 ? bits : 8.0) : 0;
  return static_cast<uint8_t>(b >= 8 ? 0xff : ((1 << b) - 1) << (8 - b));
}
GPUPIPE_HD uint8_t solarize_level(uint8_t v, float threshold) {  // where(image >= threshold, 255 - image, image), in float32
  return static_cast<float>(v) >= threshold ? static_cast<uint8_t>(255 - v) : v;
}
// The first level solarize inverts (256: none), so that a byte loop compares integers.
GPUPIPE_HD int solarize_first_level(float threshold) {
  int level = 0;
  while (level < 256 && !(static_cast<float>(level) >= threshold)) ++level;
  return level;
}

// Per-sample statistics a LUT op needs, from the stats pass.
struct Stats {
  const unsigned long long* hist = nullptr;  // [3][256] channel histograms (equalize)
  uint8_t lo[3] = {0, 0, 0}, hi[3] = {0, 0, 0};  // channel ranges (autocontrast)
  int64_t gray_sum = 0;                       // sum of gray_floor over the image (contrast)
  int64_t pixels = 0;
};

// A channel range from its histogram (the CUDA kernels count histograms, the host takes min / max).
GPUPIPE_HD void range_from_histogram(const unsigned long long* hist, Stats* s) {
  for (int c = 0; c < 3; ++c) {
    const unsigned long long* h = hist + 256 * c;
    int lo = 0, hi = 255;
    while (lo < 255 && h[lo] == 0) ++lo;
    while (hi > 0 && h[hi] == 0) --hi;
    s->lo[c] = static_cast<uint8_t>(lo);
    s->hi[c] = static_cast<uint8_t>(hi);
  }
}

// Contrast's table: each level blended with the mean level sum / pixels (the exact integer sum
// divided in float32, as torch's float32 mean of integer levels gives it).
GPUPIPE_HD void contrast_lut(int64_t sum, int64_t pixels, double factor, uint8_t* l) {
  const float mean = static_cast<float>(sum) / static_cast<float>(pixels);
  const Blend b = make_blend(factor);
  for (int v = 0; v < 256; ++v) l[v] = clamp_trunc_u8(fma_rn(mean, b.alpha, static_cast<float>(v) * b.ratio));
}

// Fills lut[3][256] for one sample of a LUT kind (is_lut_kind).
GPUPIPE_HD void build_lut(int32_t kind, double param, const Stats& s, uint8_t* lut) {
  for (int c = 0; c < 3; ++c) {
    uint8_t* l = lut + 256 * c;
    const unsigned long long* h = s.hist ? s.hist + 256 * c : nullptr;
    switch (kind) {
      case kBrightness: {
        const float f = static_cast<float>(param);
        for (int v = 0; v < 256; ++v) l[v] = brightness_level(static_cast<uint8_t>(v), f);
        break;
      }
      case kContrast:  // _blend(image, mean(gray_floor), factor); torch's float32 mean
        contrast_lut(s.gray_sum, s.pixels, param, l);
        break;
      case kContrastGray: {  // _blend(image, mean(image.float()), factor): channel 0's levels
        int64_t sum = 0;
        for (int v = 1; v < 256; ++v) sum += static_cast<int64_t>(s.hist[v]) * v;
        contrast_lut(sum, s.pixels, param, l);
        break;
      }
      case kPosterize: {
        const uint8_t mask = posterize_mask(param);
        for (int v = 0; v < 256; ++v) l[v] = static_cast<uint8_t>(v & mask);
        break;
      }
      case kSolarize: {
        const float t = static_cast<float>(param);
        for (int v = 0; v < 256; ++v) l[v] = solarize_level(static_cast<uint8_t>(v), t);
        break;
      }
      case kInvert:
        for (int v = 0; v < 256; ++v) l[v] = static_cast<uint8_t>(255 - v);
        break;
      case kAutoContrast: {  // (x - min) / ((max - min) * (1 / 255)) per channel, float32
        const int lo = s.lo[c], hi = s.hi[c];
        if (hi <= lo) {  // constant channel (or empty image): unchanged
          for (int v = 0; v < 256; ++v) l[v] = static_cast<uint8_t>(v);
          break;
        }
        const float inv_scale = static_cast<float>(hi - lo) * static_cast<float>(1.0 / 255.0);
        for (int v = 0; v < 256; ++v) l[v] = clamp_trunc_u8(static_cast<float>(v - lo) / inv_scale);
        break;
      }
      case kEqualize: {  // torchvision's (= PIL's) LUT: (cum[k-1] + step / 2) / step, step from the non-max pixels
        int last = 255;
        while (last > 0 && h[last] == 0) --last;
        const int64_t step = (s.pixels - static_cast<int64_t>(h[last])) / 255;
        if (step == 0) {
          for (int v = 0; v < 256; ++v) l[v] = static_cast<uint8_t>(v);
          break;
        }
        int64_t cum = 0;
        l[0] = 0;
        for (int v = 1; v < 256; ++v) {
          cum += h[v - 1];
          const int64_t e = (cum + step / 2) / step;
          l[v] = static_cast<uint8_t>(e > 255 ? 255 : e);
        }
        break;
      }
      default:  // kIdentity
        for (int v = 0; v < 256; ++v) l[v] = static_cast<uint8_t>(v);
    }
  }
}

}  // namespace policy
}  // namespace gpupipe
