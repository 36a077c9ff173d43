#include "resize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "multiversion.h"

namespace gpupipe {
namespace {

// Pillow's 8-bit precision: 32 bits - 8 for the sample - 2 for headroom.
constexpr int kPrecisionBits = 32 - 8 - 2;

inline double bilinear(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

inline uint8_t clip8(int32_t v) {
  if (v >= (1 << kPrecisionBits << 8)) return 255;
  if (v <= 0) return 0;
  return static_cast<uint8_t>(v >> kPrecisionBits);
}

// The passes below are GPUPIPE_MULTIVERSION (multiversion.h): AVX2 where the CPU has it.

template <int C>
inline void horizontal_pass_impl(const uint8_t* src, size_t src_stride, int first_row, int rows, uint8_t* dst,
                     size_t dst_stride, int out_w, int ksize, const int* bounds,
                     const int32_t* weights) {
  for (int y = 0; y < rows; ++y) {
    const uint8_t* in = src + static_cast<size_t>(first_row + y) * src_stride;
    uint8_t* out = dst + static_cast<size_t>(y) * dst_stride;
    for (int x = 0; x < out_w; ++x) {
      const int xmin = bounds[2 * x], xn = bounds[2 * x + 1];
      const int32_t* k = weights + static_cast<size_t>(x) * ksize;
      int32_t acc[C];
      for (int c = 0; c < C; ++c) acc[c] = 1 << (kPrecisionBits - 1);
      const uint8_t* p = in + static_cast<size_t>(xmin) * C;
      for (int i = 0; i < xn; ++i)
        for (int c = 0; c < C; ++c) acc[c] += p[i * C + c] * k[i];
      for (int c = 0; c < C; ++c) out[x * C + c] = clip8(acc[c]);
    }
  }
}

GPUPIPE_MULTIVERSION void horizontal_pass(int channels, const uint8_t* src, size_t src_stride,
                                          int first_row, int rows, uint8_t* dst, size_t dst_stride,
                                          int out_w, int ksize, const int* bounds,
                                          const int32_t* weights) {
  switch (channels) {
    case 1:
      horizontal_pass_impl<1>(src, src_stride, first_row, rows, dst, dst_stride, out_w, ksize, bounds, weights);
      break;
    case 3:
      horizontal_pass_impl<3>(src, src_stride, first_row, rows, dst, dst_stride, out_w, ksize, bounds, weights);
      break;
    default:
      horizontal_pass_impl<4>(src, src_stride, first_row, rows, dst, dst_stride, out_w, ksize, bounds, weights);
      break;
  }
}

// Vertical taps are applied a whole row at a time so the inner loop runs over contiguous bytes.
GPUPIPE_MULTIVERSION void vertical_pass(const uint8_t* src, size_t src_stride, int row_offset, uint8_t* dst,
                   size_t dst_stride, int out_h, int row_bytes, int ksize, const int* bounds,
                   const int32_t* weights, std::vector<int32_t>* acc_buf) {
  acc_buf->resize(row_bytes);
  int32_t* acc = acc_buf->data();
  for (int y = 0; y < out_h; ++y) {
    const int ymin = bounds[2 * y] - row_offset, yn = bounds[2 * y + 1];
    const int32_t* k = weights + static_cast<size_t>(y) * ksize;
    std::fill(acc, acc + row_bytes, 1 << (kPrecisionBits - 1));
    for (int i = 0; i < yn; ++i) {
      const uint8_t* in = src + static_cast<size_t>(ymin + i) * src_stride;
      const int32_t w = k[i];
      for (int b = 0; b < row_bytes; ++b) acc[b] += in[b] * w;
    }
    uint8_t* out = dst + static_cast<size_t>(y) * dst_stride;
    for (int b = 0; b < row_bytes; ++b) out[b] = clip8(acc[b]);
  }
}

}  // namespace

// Pillow's precompute_coeffs + normalize_coeffs_8bpc (libImaging/Resample.c), term for term.
void Resampler::compute(int in_size, double in0, double in1, int out_size, Coeffs* c) {
  const double scale = (in1 - in0) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = 1.0 * filterscale;
  const int ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c->ksize = ksize;
  c->bounds.resize(2 * static_cast<size_t>(out_size));
  c->weights.resize(static_cast<size_t>(out_size) * ksize);
  c->scratch.resize(ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    double* k = c->scratch.data();
    int x = 0;
    for (; x < xmax; ++x) {
      k[x] = bilinear((x + xmin - center + 0.5) * ss);
      ww += k[x];
    }
    int32_t* kk = c->weights.data() + static_cast<size_t>(xx) * ksize;
    for (x = 0; x < ksize; ++x) {
      double v = x < xmax ? (ww != 0.0 ? k[x] / ww : k[x]) : 0.0;
      kk[x] = v < 0 ? static_cast<int32_t>(-0.5 + v * (1 << kPrecisionBits))
                    : static_cast<int32_t>(0.5 + v * (1 << kPrecisionBits));
    }
    c->bounds[2 * xx] = xmin;
    c->bounds[2 * xx + 1] = xmax < 0 ? 0 : xmax;
  }
}

void Resampler::resize(const uint8_t* src, int src_h, int src_w, int channels, size_t src_stride,
                       double x0, double y0, double x1, double y1, uint8_t* dst, int dst_h,
                       int dst_w, size_t dst_stride) {
  // Pillow skips a pass whose axis keeps its size and box.
  const bool need_h = dst_w != src_w || x0 != 0.0 || x1 != src_w;
  const bool need_v = dst_h != src_h || y0 != 0.0 || y1 != src_h;
  compute(src_w, x0, x1, dst_w, &horizontal_);
  compute(src_h, y0, y1, dst_h, &vertical_);

  const uint8_t* vsrc = src;
  size_t vstride = src_stride;
  int row_offset = 0;
  if (need_h) {
    const int* vb = vertical_.bounds.data();
    const int first = need_v ? vb[0] : 0;
    const int last = need_v ? vb[2 * dst_h - 2] + vb[2 * dst_h - 1] : src_h;
    const int rows = last - first;
    const size_t tstride = static_cast<size_t>(dst_w) * channels;
    uint8_t* out = need_v ? nullptr : dst;
    if (need_v) {
      temp_.resize(tstride * rows);
      out = temp_.data();
    }
    const size_t ostride = need_v ? tstride : dst_stride;
    horizontal_pass(channels, src, src_stride, first, rows, out, ostride, dst_w, horizontal_.ksize,
                    horizontal_.bounds.data(), horizontal_.weights.data());
    if (!need_v) return;
    vsrc = temp_.data();
    vstride = tstride;
    row_offset = first;
  }
  const int row_bytes = (need_h ? dst_w : src_w) * channels;
  if (need_v) {
    vertical_pass(vsrc, vstride, row_offset, dst, dst_stride, dst_h, row_bytes, vertical_.ksize,
                  vertical_.bounds.data(), vertical_.weights.data(), &acc_);
    return;
  }
  for (int y = 0; y < dst_h; ++y)  // neither pass: a plain copy
    std::memcpy(dst + y * dst_stride, src + y * src_stride, static_cast<size_t>(row_bytes));
}

}  // namespace gpupipe
