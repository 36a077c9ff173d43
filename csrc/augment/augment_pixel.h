// Per-pixel math of gpupipe's augmentations, shared by the CUDA kernels (cuda/augment.cu) and their
// host builds (csrc/augment/augment_cpu.cpp), so that the GPU's arithmetic is tested on machines
// without one. Plain C++17 (and CUDA when compiled by nvcc); nothing here knows Python or torch.
//
// Rounding contract: every float operation below is ONE IEEE-754 binary32 operation, rounded to
// nearest even, in the order written. On the device the arithmetic goes through the _rn intrinsics,
// which nvcc never contracts into FMAs; on the host every file including this header is compiled
// with -ffp-contract=off (CMakeLists.txt), so the FMA of the AVX2 and AVX-512 builds (multiversion.h) is never used.
// Vectorising a loop of these calls does not change any result (SIMD add/mul/div/min/max/round are
// the same IEEE operations lane by lane). So host and device give the same bits for the same inputs;
// tests/test_augment_pixel.py holds the host build to a float32 emulation of this exact sequence.
//
// Coordinates: pixel (x, y) has its centre at integer coordinates (x = column, y = row); pixel x
// covers [x - 0.5, x + 0.5) (torch's grid_sample with align_corners=False). A 2x3 matrix m maps an
// OUTPUT pixel to the INPUT coordinate it reads: sx = m0 x + m1 y + m2, sy = m3 x + m4 y + m5.
#pragma once

#include <math.h>
#include <stdint.h>

#include "common/host_device.h"

namespace gpupipe {
namespace pixel {

// --- arithmetic, rounded alike on host and device ----------------------------------------------

GPUPIPE_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
GPUPIPE_HD float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
GPUPIPE_HD float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
GPUPIPE_HD float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
// min/max of non-NaN values (all values here are finite): exact on both sides.
GPUPIPE_HD float min(float a, float b) { return b < a ? b : a; }
GPUPIPE_HD float max(float a, float b) { return a < b ? b : a; }
GPUPIPE_HD float clamp01(float v) { return min(max(v, 0.0f), 1.0f); }
GPUPIPE_HD float floor(float v) { return floorf(v); }
GPUPIPE_HD float round_even(float v) { return rintf(v); }  // default rounding mode: half to even

// --- geometry ------------------------------------------------------------------------------------

// The input coordinate read for output pixel (x, y): (m0 x + m1 y) + m2, (m3 x + m4 y) + m5.
GPUPIPE_HD void affine_source(const float* m, float x, float y, float* sx, float* sy) {
  *sx = add(add(mul(m[0], x), mul(m[1], y)), m[2]);
  *sy = add(add(mul(m[3], x), mul(m[4], y)), m[5]);
}

// One sample of a uint8 image with 3 channels and any strides (in bytes).
struct Image8 {
  const uint8_t* data;
  int64_t h, w;
  int64_t sc, sy, sx;  // channel, row and column strides
};

enum Interpolation : int { kNearest = 0, kBilinear = 1 };

// How pixels outside the image are filled, as torchvision's _apply_grid_transform does it:
// without a fill (fill=None) they count as 0 (zero padding); with a fill, nearest writes the fill
// where the nearest pixel is outside, and bilinear blends as out = (v - fill) * mask + fill, mask
// being the sum of the in-image weights (so v, already weighted, is weighted again: torchvision's
// formula, https://github.com/pytorch/vision/issues/6517).
struct Fill {
  bool enabled;
  float value[3];  // per channel, on the input's 0..255 scale
};

// The pixel nearest input coordinate (sx, sy): column rint(sx), row rint(sy) (half to even, as
// grid_sample's nearbyint), or column -1 when it lies outside the image. Branch-free, so a row loop
// of it vectorises (the policies' host kernel computes a row of these, then gathers).
GPUPIPE_HD void nearest_pixel(const Image8& im, float sx, float sy, int32_t* column, int32_t* row) {
  const float fx = round_even(sx), fy = round_even(sy);
  const bool inside = (fx >= 0.0f) & (fx <= static_cast<float>(im.w - 1)) & (fy >= 0.0f) &
                      (fy <= static_cast<float>(im.h - 1));  // false for NaN too
  *column = inside ? static_cast<int32_t>(fx) : -1;
  *row = inside ? static_cast<int32_t>(fy) : 0;
}

// Samples the 3 channels at input coordinate (sx, sy), on the 0..255 scale (not rounded).
// Nearest: the pixel at (rint(sx), rint(sy)) (nearest_pixel).
// Bilinear: the 4 neighbours weighted by (1 - fx, fx) x (1 - fy, fy), neighbours outside weigh 0.
// Offset: the type of byte offsets within the image; int32_t (fewer address instructions on the
// device) only where the caller has checked that every offset of the image fits.
template <typename Offset = int64_t>
GPUPIPE_HD void sample(const Image8& im, int interpolation, const Fill& fill, float sx, float sy,
                       float out[3]) {
  const float last_x = static_cast<float>(im.w - 1), last_y = static_cast<float>(im.h - 1);
  if (interpolation == kNearest) {
    int32_t column, row;
    nearest_pixel(im, sx, sy, &column, &row);
    if (column >= 0) {
      const Offset sc = static_cast<Offset>(im.sc);
      const uint8_t* p = im.data + (static_cast<Offset>(row) * static_cast<Offset>(im.sy) +
                                    static_cast<Offset>(column) * static_cast<Offset>(im.sx));
      out[0] = p[0];
      out[1] = p[sc];
      out[2] = p[2 * sc];
    } else {
      for (int c = 0; c < 3; ++c) out[c] = fill.enabled ? fill.value[c] : 0.0f;
    }
    return;
  }
  const float x0 = floor(sx), y0 = floor(sy);
  const float wx1 = sub(sx, x0), wy1 = sub(sy, y0);
  const float wx0 = sub(1.0f, wx1), wy0 = sub(1.0f, wy1);
  // A neighbour outside the image weighs 0 and is read at a clamped position (branch-free).
  const bool in_x0 = x0 >= 0.0f && x0 <= last_x, in_x1 = x0 >= -1.0f && x0 < last_x;
  const bool in_y0 = y0 >= 0.0f && y0 <= last_y, in_y1 = y0 >= -1.0f && y0 < last_y;
  const float w00 = (in_y0 && in_x0) ? mul(wy0, wx0) : 0.0f;
  const float w01 = (in_y0 && in_x1) ? mul(wy0, wx1) : 0.0f;
  const float w10 = (in_y1 && in_x0) ? mul(wy1, wx0) : 0.0f;
  const float w11 = (in_y1 && in_x1) ? mul(wy1, wx1) : 0.0f;
  // 32-bit taps (sides are below 2^24, checked at the bindings): cheaper conversions and products.
  const int32_t cx0 = in_x0 ? static_cast<int32_t>(x0) : 0, cx1 = in_x1 ? static_cast<int32_t>(x0) + 1 : 0;
  const int32_t cy0 = in_y0 ? static_cast<int32_t>(y0) : 0, cy1 = in_y1 ? static_cast<int32_t>(y0) + 1 : 0;
  const Offset sy_ = static_cast<Offset>(im.sy), sx_ = static_cast<Offset>(im.sx);
  const Offset oy0 = cy0 * sy_, oy1 = cy1 * sy_, ox0 = cx0 * sx_, ox1 = cx1 * sx_;
  const uint8_t *p00 = im.data + (oy0 + ox0), *p01 = im.data + (oy0 + ox1);
  const uint8_t *p10 = im.data + (oy1 + ox0), *p11 = im.data + (oy1 + ox1);
  const float mask = add(add(add(w00, w01), w10), w11);
  for (int c = 0; c < 3; ++c) {
    const Offset o = c * static_cast<Offset>(im.sc);
    float v = add(add(add(mul(w00, p00[o]), mul(w01, p01[o])), mul(w10, p10[o])), mul(w11, p11[o]));
    if (fill.enabled) v = add(mul(sub(v, fill.value[c]), mask), fill.value[c]);
    out[c] = v;
  }
}

// A sampled value on the 0..255 scale to uint8, as torchvision rounds a uint8 rotate
// (float.round_().to(uint8)); values are within [0, 255] for fills within [0, 255].
GPUPIPE_HD uint8_t to_uint8(float v) { return static_cast<uint8_t>(round_even(v)); }

// --- color: torchvision.transforms.v2.functional's float path on values in [0, 1] ---------------

constexpr float kInv255 = 1.0f / 255.0f;  // to_dtype(float32, scale=True): u8 * float(1 / 255)

// rgb_to_grayscale: 0.2989 r + 0.587 g + 0.114 b.
GPUPIPE_HD float luma(float r, float g, float b) {
  return add(add(mul(r, 0.2989f), mul(g, 0.587f)), mul(b, 0.114f));
}

// adjust_brightness: clamp(v * f, 0, 1).
GPUPIPE_HD float brightness(float v, float f) { return clamp01(mul(v, f)); }

// _blend(v, other, ratio) = clamp(v * ratio + (1 - ratio) * other, 0, 1); `term` = (1 - ratio) * other.
GPUPIPE_HD float blend(float v, float ratio, float term) { return clamp01(add(mul(v, ratio), term)); }
GPUPIPE_HD float blend_term(float ratio, float other) { return mul(sub(1.0f, ratio), other); }

// adjust_contrast blends towards the image's mean luma (one value per image: contrast_term(c, mean)).
// adjust_saturation blends towards the pixel's own luma.
GPUPIPE_HD void saturation(float* r, float* g, float* b, float s) {
  const float term = blend_term(s, luma(*r, *g, *b));
  *r = blend(*r, s, term);
  *g = blend(*g, s, term);
  *b = blend(*b, s, term);
}

// The value of sector i of torchvision's _hsv_to_rgb select table (rows r, g, b; i in 0..5), as a
// chain of two-way selects.
GPUPIPE_HD float hsv_pick(float i, float v0, float v1, float v2, float v3, float v4, float v5) {
  float v = v5;
  v = i == 4.0f ? v4 : v;
  v = i == 3.0f ? v3 : v;
  v = i == 2.0f ? v2 : v;
  v = i == 1.0f ? v1 : v;
  return i == 0.0f ? v0 : v;
}

// adjust_hue: RGB -> HSV (torchvision's _rgb_to_hsv, after Pillow), h = (h + hue) mod 1, HSV -> RGB
// (_hsv_to_rgb), branch-free: every candidate computed, then selected (host loops vectorise).
// Two differences in the order of operations, both within an ULP of torchvision: the three
// divisions by the chroma range are one reciprocal and three products, and torchvision's masked
// sum hr + hg + hb (one term non-zero) is a selection.
GPUPIPE_HD void hue(float* r, float* g, float* b, float hue_shift) {
  const float R = *r, G = *g, B = *b;
  const float maxc = max(max(R, G), B), minc = min(min(R, G), B);
  const float range = sub(maxc, minc);
  // s = range / maxc, 0 for grays: selected rather than divided (0 / 1), as a zero dividend sends
  // the device's division down its slow path
  const bool gray = maxc == minc;
  const float s = gray ? 0.0f : div(gray ? 1.0f : range, gray ? 1.0f : maxc);
  const float inv = div(1.0f, gray ? 1.0f : range);
  const float rc = mul(sub(maxc, R), inv), gc = mul(sub(maxc, G), inv), bc = mul(sub(maxc, B), inv);
  const float hr = sub(bc, gc), hg = sub(add(rc, 2.0f), bc), hb = sub(add(gc, 4.0f), rc);
  float h = maxc == R ? hr : (maxc == G ? hg : hb);
  h = add(mul(h, 1.0f / 6.0f), 1.0f);   // in [5/6, 11/6]
  const float wrapped = sub(h, 1.0f);
  h = h >= 1.0f ? wrapped : h;          // fmod(h, 1): exact
  h = add(h, hue_shift);
  h = sub(h, floor(h));                 // remainder(h, 1)
  // _hsv_to_rgb
  const float h6 = mul(h, 6.0f);
  float i = floor(h6);
  const float f = sub(h6, i);
  i = i == 6.0f ? 0.0f : i;  // i % 6 (h is in [0, 1])
  const float v = maxc;
  const float sf = mul(s, f), one_minus_s = sub(1.0f, s);
  const float q = clamp01(mul(sub(1.0f, sf), v));
  const float t = clamp01(mul(add(sf, one_minus_s), v));
  const float p = clamp01(mul(one_minus_s, v));
  *r = hsv_pick(i, v, q, p, p, t, v);
  *g = hsv_pick(i, t, v, v, q, p, p);
  *b = hsv_pick(i, p, p, t, v, v, q);
}

// The color ops' ids in a sample's order: torchvision ColorJitter's fn_idx.
enum ColorOp : int { kBrightness = 0, kContrast = 1, kSaturation = 2, kHue = 3 };

// One color op on one pixel; `contrast_term` = blend_term(contrast factor, the image's mean luma).
GPUPIPE_HD void color_op(int op, float* r, float* g, float* b, float factor, float contrast_term) {
  switch (op) {
    case kBrightness:
      *r = brightness(*r, factor);
      *g = brightness(*g, factor);
      *b = brightness(*b, factor);
      break;
    case kContrast:
      *r = blend(*r, factor, contrast_term);
      *g = blend(*g, factor, contrast_term);
      *b = blend(*b, factor, contrast_term);
      break;
    case kSaturation:
      saturation(r, g, b, factor);
      break;
    default:
      hue(r, g, b, factor);
      break;
  }
}

// --- the image mean for contrast, exact and order-independent -----------------------------------
// A luma in [0, 1] as a 2^-24 fixed-point integer (rounded half to even): sums of these are exact
// in any order, so the mean is the same bits on any thread count, on the host and on the device.
constexpr float kMeanScale = 16777216.0f;  // 2^24

GPUPIPE_HD int32_t mean_fixed(float luma_value) {
  return static_cast<int32_t>(round_even(mul(luma_value, kMeanScale)));
}
GPUPIPE_HD float mean_from_sum(int64_t sum, int64_t count) {
  return static_cast<float>(static_cast<double>(sum) / (static_cast<double>(count) * 16777216.0));
}

// --- normalise and store ---------------------------------------------------------------------

// (v - mean) * (1 / std): within 1.5 ULP of torchvision's (v - mean) / std.
GPUPIPE_HD float normalize(float v, float mean, float inv_std) { return mul(sub(v, mean), inv_std); }

GPUPIPE_HD uint32_t float_bits(float f) {
  union {
    float f;
    uint32_t u;
  } v;
  v.f = f;
  return v.u;
}

// float -> bfloat16 bits, round to nearest even (NaN stays NaN), as torch's conversion.
GPUPIPE_HD uint16_t to_bfloat16_bits(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// float -> IEEE half bits, round to nearest even, overflow to inf, subnormals kept. Branch-free
// (every case computed, one selected), so host loops vectorise.
GPUPIPE_HD uint16_t to_float16_bits(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  // normal: rebias the exponent 127 -> 15 (in the float's bit positions), round 13 bits to even
  uint32_t normal = abs - 0x38000000u;
  normal = (normal + 0xfffu + ((normal >> 13) & 1u)) >> 13;
  // subnormal (2^-25 <= |f| < 2^-14): value / 2^-24 = mantissa24 * 2^(exp - 126), drop (126 - exp)
  // bits rounding to even; the shift is clamped to stay defined where this case is not selected
  const int e = static_cast<int>(abs >> 23);
  int drop = 126 - e;
  drop = drop < 1 ? 1 : drop;
  drop = drop > 31 ? 31 : drop;
  const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t sub_normal = (mant + ((1u << (drop - 1)) - 1u) + ((mant >> drop) & 1u)) >> drop;
  // bit-mask selects (the compiler would merge ternaries back into one many-way branch)
  auto pick = [](bool cond, uint32_t a, uint32_t b) { const uint32_t m = 0u - static_cast<uint32_t>(cond); return (a & m) | (b & ~m); };
  uint32_t h = normal;
  h = pick(abs < 0x38800000u, sub_normal, h);  // below the smallest normal half
  h = pick(abs < 0x33000000u, 0u, h);          // < 2^-25: 0
  h = pick(abs >= 0x477ff000u, 0x7c00u, h);    // >= 65520: inf
  h = pick(abs > 0x7f800000u, 0x7e00u, h);     // NaN
  return static_cast<uint16_t>(sign | h);
}

}  // namespace pixel
}  // namespace gpupipe
