// Per-pixel math of gpupipe's augmentations, shared by the CUDA kernels (cuda/augment.cu) and their
// host builds (csrc/augment_cpu.cpp), so that the GPU's arithmetic is tested on machines without
// one. Plain C++17 (and CUDA when compiled by nvcc); nothing here knows Python or torch.
//
// Rounding contract: every float operation below is ONE IEEE-754 binary32 operation, rounded to
// nearest even, in the order written. On the device the arithmetic goes through the _rn intrinsics,
// which nvcc never contracts into FMAs; on the host every file including this header is compiled
// with -ffp-contract=off (CMakeLists.txt), and the AVX2 clones of GPUPIPE_MULTIVERSION enable no FMA.
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

#if defined(__CUDACC__)
#define GPUPIPE_HD __host__ __device__ __forceinline__
#else
#define GPUPIPE_HD inline
#endif

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
GPUPIPE_HD void sample(const Image8& im, int interpolation, const Fill& fill, float sx, float sy,
                       float out[3]) {
  const float last_x = static_cast<float>(im.w - 1), last_y = static_cast<float>(im.h - 1);
  if (interpolation == kNearest) {
    int32_t column, row;
    nearest_pixel(im, sx, sy, &column, &row);
    if (column >= 0) {
      const uint8_t* p = im.data + static_cast<int64_t>(row) * im.sy + static_cast<int64_t>(column) * im.sx;
      out[0] = p[0];
      out[1] = p[im.sc];
      out[2] = p[2 * im.sc];
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
  const int64_t cx0 = in_x0 ? static_cast<int64_t>(x0) : 0, cx1 = in_x1 ? static_cast<int64_t>(x0) + 1 : 0;
  const int64_t cy0 = in_y0 ? static_cast<int64_t>(y0) : 0, cy1 = in_y1 ? static_cast<int64_t>(y0) + 1 : 0;
  const uint8_t* p00 = im.data + cy0 * im.sy + cx0 * im.sx;
  const uint8_t* p01 = im.data + cy0 * im.sy + cx1 * im.sx;
  const uint8_t* p10 = im.data + cy1 * im.sy + cx0 * im.sx;
  const uint8_t* p11 = im.data + cy1 * im.sy + cx1 * im.sx;
  const float mask = add(add(add(w00, w01), w10), w11);
  for (int c = 0; c < 3; ++c) {
    const int64_t o = c * im.sc;
    float v = add(add(add(mul(w00, p00[o]), mul(w01, p01[o])), mul(w10, p10[o])), mul(w11, p11[o]));
    if (fill.enabled) v = add(mul(sub(v, fill.value[c]), mask), fill.value[c]);
    out[c] = v;
  }
}

// A sampled value on the 0..255 scale to uint8, as torchvision rounds a uint8 rotate
// (float.round_().to(uint8)); values are within [0, 255] for fills within [0, 255].
GPUPIPE_HD uint8_t to_uint8(float v) { return static_cast<uint8_t>(round_even(v)); }

}  // namespace pixel
}  // namespace gpupipe
