// Per-output-value arithmetic of Pillow's antialiased BILINEAR resample (libImaging/Resample.c,
// Pillow >= 13: precompute_coeffs + normalize_coeffs_8bpc, 22-bit fixed point), shared by the CPU
// core's Resampler (resize.cpp), the ragged crop-resize's host build (crop_resize.cpp) and its CUDA
// kernels (cuda/crop_resize.cu), so the GPU's coefficients are the CPU core's, tested without a GPU.
//
// Rounding contract: every double operation in output_taps is ONE IEEE-754 binary64 operation, rounded
// to nearest even, in Pillow's order. On the device it goes through the _rn intrinsics, which nvcc never
// contracts into an FMA (whatever --fmad says; _C_cuda also builds with --fmad=false); the host builds
// use -ffp-contract=off. Division and ceil are correctly rounded / exact on both sides. The taps and
// clip8 are integer arithmetic: any order, same bits.
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "common/host_device.h"

namespace gpupipe {
namespace resample {

// Pillow's 8-bit precision: 32 bits - 8 for the sample - 2 for headroom.
constexpr int kPrecisionBits = 32 - 8 - 2;

GPUPIPE_HD double dmul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
GPUPIPE_HD double dadd(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
GPUPIPE_HD double dsub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
GPUPIPE_HD double ddiv(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

// Pillow's bilinear filter (support 1).
GPUPIPE_HD double bilinear(double x) {
  x = fabs(x);
  return x < 1.0 ? dsub(1.0, x) : 0.0;
}

// One axis of a resample: the box [in0, in1) of in_size input pixels onto out_size outputs.
struct Axis {
  int in_size = 0, out_size = 0;
  int ksize = 0;  // taps per output, padded: Pillow's ksize
  double in0 = 0, scale = 0, support = 0, ss = 0;
};

// precompute_coeffs' setup (filterscale = max(scale, 1), support = 1 * filterscale).
GPUPIPE_HD Axis axis_of(int in_size, double in0, double in1, int out_size) {
  Axis a;
  a.in_size = in_size;
  a.out_size = out_size;
  a.in0 = in0;
  a.scale = ddiv(dsub(in1, in0), static_cast<double>(out_size));
  const double filterscale = a.scale < 1.0 ? 1.0 : a.scale;
  a.support = filterscale;  // Pillow's 1.0 * filterscale: exact
  a.ksize = static_cast<int>(ceil(a.support)) * 2 + 1;
  a.ss = ddiv(1.0, filterscale);
  return a;
}

// Output `xx`'s taps: the first input index, how many, and (weights != nullptr) its a.ksize 22-bit
// weights (zero past the count). Pillow keeps the unnormalised weights in a scratch array; they are
// recomputed here instead (the same operations, the same bits), so the device needs no array.
GPUPIPE_HD void output_taps(const Axis& a, int xx, int* first, int* count, int32_t* weights) {
  const double center = dadd(a.in0, dmul(dadd(static_cast<double>(xx), 0.5), a.scale));
  int xmin = static_cast<int>(dadd(dsub(center, a.support), 0.5));
  if (xmin < 0) xmin = 0;
  int xmax = static_cast<int>(dadd(dadd(center, a.support), 0.5));
  if (xmax > a.in_size) xmax = a.in_size;
  xmax -= xmin;
  *first = xmin;
  *count = xmax < 0 ? 0 : xmax;
  if (!weights) return;
  // the tap's filter value: (x + xmin - center + 0.5) * ss, x + xmin an int sum as in Pillow
  auto tap = [&](int x) { return bilinear(dmul(dadd(dsub(static_cast<double>(x + xmin), center), 0.5), a.ss)); };
  double ww = 0.0;
  for (int x = 0; x < xmax; ++x) ww = dadd(ww, tap(x));
  for (int x = 0; x < a.ksize; ++x) {
    const double v = x < xmax ? (ww != 0.0 ? ddiv(tap(x), ww) : tap(x)) : 0.0;
    const double fixed = dmul(v, static_cast<double>(1 << kPrecisionBits));  // exact: a power of two
    weights[x] = v < 0 ? static_cast<int32_t>(dadd(-0.5, fixed)) : static_cast<int32_t>(dadd(0.5, fixed));
  }
}

GPUPIPE_HD uint8_t clip8(int32_t v) {
  if (v >= (1 << kPrecisionBits << 8)) return 255;
  if (v <= 0) return 0;
  return static_cast<uint8_t>(v >> kPrecisionBits);
}

// Channel c of one output of the horizontal pass: `count` pixels of `channels` bytes from `first`
// in the row `in`.
GPUPIPE_HD uint8_t horizontal_value(const uint8_t* in, int channels, int c, int first, int count,
                                    const int32_t* weights) {
  int32_t acc = 1 << (kPrecisionBits - 1);
  const uint8_t* p = in + static_cast<ptrdiff_t>(first) * channels + c;
  for (int i = 0; i < count; ++i) acc += p[static_cast<ptrdiff_t>(i) * channels] * weights[i];
  return clip8(acc);
}

// One output byte of the vertical pass: `count` rows `stride` bytes apart from `in` (the byte in
// the first tap's row).
GPUPIPE_HD uint8_t vertical_value(const uint8_t* in, size_t stride, int count, const int32_t* weights) {
  int32_t acc = 1 << (kPrecisionBits - 1);
  for (int i = 0; i < count; ++i) acc += in[static_cast<size_t>(i) * stride] * weights[i];
  return clip8(acc);
}

}  // namespace resample
}  // namespace gpupipe
