#include "decode/resize.h"

#include <algorithm>
#include <cstring>

#include "common/multiversion.h"
#include "decode/crop_resize_pixel.h"

#if GPUPIPE_X86_LEVELS
#include <immintrin.h>
#endif

namespace gpupipe {
namespace {

using resample::clip8;
using resample::kPrecisionBits;

// The passes below run under dispatch() (multiversion.h): vectorised at the CPU's width.

// Outputs [x_begin, out_w) of one row.
template <int C>
inline void horizontal_row(const uint8_t* in, uint8_t* out, int x_begin, int out_w, int ksize, const int* bounds,
                           const int32_t* weights) {
  for (int x = x_begin; x < out_w; ++x) {
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

template <int C>
inline void horizontal_pass_impl(const uint8_t* src, size_t src_stride, int first_row, int rows, uint8_t* dst,
                                 size_t dst_stride, int out_w, int ksize, const int* bounds,
                                 const int32_t* weights) {
  for (int y = 0; y < rows; ++y)
    horizontal_row<C>(src + static_cast<size_t>(first_row + y) * src_stride, dst + static_cast<size_t>(y) * dst_stride,
                      0, out_w, ksize, bounds, weights);
}

#if GPUPIPE_X86_LEVELS
// RGB, eight outputs at a time: tap i of the eight is eight 4-byte loads (the pixel and the next
// byte, which is masked off) at precomputed byte offsets, put in one vector, then exact int32
// multiply-adds in the order of the scalar loop, so the result is bit-identical to it. Plain loads
// and inserts rather than vpgatherdd: with the gather, a whole resize to 176x176 took 1.1-1.4x the
// time on Zen 3 (and Intel's microcode fix for GDS is reported to slow gathers down). Outputs whose
// taps reach the row's last pixel are left to the scalar loop (their 4-byte read would pass the
// row's end).
// `offsets` and `lane_weights` are [ksize][out_w]: per tap, the byte offset in the row (a padded
// tap repeats the output's last real one; its weight is 0) and the weight. `group_taps[g]`: the
// taps outputs 8g..8g+7 have (the most of their xn); ksize pads for the widest window of the row,
// and a shrinking box's outputs mostly have fewer (scale 1.1: 2-3 taps of 5), the rest adding 0.
GPUPIPE_TARGET_AVX2 int horizontal_rgb_avx2(const uint8_t* in, uint8_t* out, int out_w, int vec_w,
                                                        const int32_t* group_taps, const int32_t* offsets,
                                                        const int32_t* lane_weights) {
  const __m256i half = _mm256_set1_epi32(1 << (kPrecisionBits - 1));
  const __m256i byte = _mm256_set1_epi32(0xFF);
  const __m256i zero = _mm256_setzero_si256(), top = _mm256_set1_epi32(255);
  const __m256i pack = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,  //
                                        0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
  int x = 0;
  for (; x + 8 <= vec_w; x += 8) {
    __m256i r = half, g = half, b = half;
    const int taps = group_taps[x / 8];
    for (int i = 0; i < taps; ++i) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lane_weights + static_cast<size_t>(i) * out_w + x));
      const int32_t* tap = offsets + static_cast<size_t>(i) * out_w + x;
      int32_t v[8];
      for (int j = 0; j < 8; ++j) std::memcpy(&v[j], in + tap[j], 4);
      const __m256i px = _mm256_setr_epi32(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
      r = _mm256_add_epi32(r, _mm256_mullo_epi32(_mm256_and_si256(px, byte), w));
      g = _mm256_add_epi32(g, _mm256_mullo_epi32(_mm256_and_si256(_mm256_srli_epi32(px, 8), byte), w));
      b = _mm256_add_epi32(b, _mm256_mullo_epi32(_mm256_and_si256(_mm256_srli_epi32(px, 16), byte), w));
    }
    // clip8: the arithmetic shift, then clamped to 0..255 (negative sums give 0); the three channels
    // packed into one word per output, its 3 bytes gathered to the front of each 128-bit half
    // (4 outputs, 12 bytes), stored as 8 + 4 bytes (never past the 24 bytes of these outputs).
    r = _mm256_min_epi32(_mm256_max_epi32(_mm256_srai_epi32(r, kPrecisionBits), zero), top);
    g = _mm256_min_epi32(_mm256_max_epi32(_mm256_srai_epi32(g, kPrecisionBits), zero), top);
    b = _mm256_min_epi32(_mm256_max_epi32(_mm256_srai_epi32(b, kPrecisionBits), zero), top);
    const __m256i rgb =
        _mm256_shuffle_epi8(_mm256_or_si256(r, _mm256_or_si256(_mm256_slli_epi32(g, 8), _mm256_slli_epi32(b, 16))), pack);
    uint8_t* o = out + static_cast<size_t>(x) * 3;
    for (int k = 0; k < 2; ++k) {
      const __m128i four = k ? _mm256_extracti128_si256(rgb, 1) : _mm256_castsi256_si128(rgb);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(o + 12 * k), four);
      const int32_t tail = _mm_extract_epi32(four, 2);
      std::memcpy(o + 12 * k + 8, &tail, 4);
    }
  }
  return x;
}
#endif

void horizontal_pass(int channels, const uint8_t* src, size_t src_stride,
                                          int first_row, int rows, uint8_t* dst, size_t dst_stride,
                                          int out_w, int ksize, const int* bounds,
                                          const int32_t* weights) {
  dispatch([&](auto) {
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
  });
}

// One output row of the vertical pass from its `taps` input rows. Arguments by value and restrict
// pointers: written inline in the dispatched lambda, the loop's bound (captured by reference) could
// alias the int32 accumulator, and gcc left it scalar (2.5x slower, measured).
inline void vertical_row(const uint8_t* __restrict__ first, size_t stride, int taps, const int32_t* __restrict__ k,
                         int row_bytes, int32_t* __restrict__ acc, uint8_t* __restrict__ out) {
  std::fill(acc, acc + row_bytes, 1 << (kPrecisionBits - 1));
  for (int i = 0; i < taps; ++i) {
    const uint8_t* __restrict__ in = first + static_cast<size_t>(i) * stride;
    const int32_t w = k[i];
    for (int b = 0; b < row_bytes; ++b) acc[b] += in[b] * w;
  }
  for (int b = 0; b < row_bytes; ++b) out[b] = clip8(acc[b]);
}

// Vertical taps are applied a whole row at a time so the inner loop runs over contiguous bytes.
void vertical_pass(const uint8_t* src, size_t src_stride, int row_offset, uint8_t* dst, size_t dst_stride, int out_h,
                   int row_bytes, int ksize, const int* bounds, const int32_t* weights,
                   std::vector<int32_t>* acc_buf) {
  acc_buf->resize(row_bytes);
  int32_t* acc = acc_buf->data();
  dispatch([&](auto) {
    for (int y = 0; y < out_h; ++y) {
      const int ymin = bounds[2 * y] - row_offset;
      vertical_row(src + static_cast<size_t>(ymin) * src_stride, src_stride, bounds[2 * y + 1],
                   weights + static_cast<size_t>(y) * ksize, row_bytes, acc, dst + static_cast<size_t>(y) * dst_stride);
    }
  });
}

}  // namespace

// Pillow's precompute_coeffs + normalize_coeffs_8bpc (libImaging/Resample.c), term for term, in the
// per-output form the CUDA kernels share (crop_resize_pixel.h).
void Resampler::compute(int in_size, double in0, double in1, int out_size, Coeffs* c) {
  const resample::Axis axis = resample::axis_of(in_size, in0, in1, out_size);
  c->ksize = axis.ksize;
  c->bounds.resize(2 * static_cast<size_t>(out_size));
  c->weights.resize(static_cast<size_t>(out_size) * axis.ksize);
  for (int xx = 0; xx < out_size; ++xx)
    resample::output_taps(axis, xx, &c->bounds[2 * xx], &c->bounds[2 * xx + 1],
                          c->weights.data() + static_cast<size_t>(xx) * axis.ksize);
}

bool Resampler::horizontal_rgb_fast(int channels, const uint8_t* src, size_t src_stride, int first_row, int rows,
                                    uint8_t* dst, size_t dst_stride, int src_w, int out_w) {
#if GPUPIPE_X86_LEVELS
  if (channels != 3 || cpu_level() < CpuLevel::kAvx2) return false;
  const Coeffs& h = horizontal_;
  const int ksize = h.ksize;
  // The prefix of outputs read 4 bytes per tap: every such read stays inside the row.
  int vec_w = 0;
  while (vec_w < out_w && h.bounds[2 * vec_w + 1] > 0 && h.bounds[2 * vec_w] + h.bounds[2 * vec_w + 1] <= src_w - 1)
    ++vec_w;
  vec_w &= ~7;
  if (vec_w == 0) return false;
  lane_offsets_.resize(static_cast<size_t>(ksize) * out_w);
  lane_weights_.resize(static_cast<size_t>(ksize) * out_w);
  group_taps_.assign(static_cast<size_t>(vec_w / 8), 0);
  for (int x = 0; x < vec_w; ++x) {
    const int xmin = h.bounds[2 * x], xn = h.bounds[2 * x + 1];
    group_taps_[x / 8] = std::max(group_taps_[x / 8], xn);
    for (int i = 0; i < ksize; ++i) {
      lane_offsets_[static_cast<size_t>(i) * out_w + x] = 3 * (xmin + std::min(i, xn - 1));
      lane_weights_[static_cast<size_t>(i) * out_w + x] = h.weights[static_cast<size_t>(x) * ksize + i];
    }
  }
  for (int y = 0; y < rows; ++y) {
    const uint8_t* in = src + static_cast<size_t>(first_row + y) * src_stride;
    uint8_t* out = dst + static_cast<size_t>(y) * dst_stride;
    const int done =
        horizontal_rgb_avx2(in, out, out_w, vec_w, group_taps_.data(), lane_offsets_.data(), lane_weights_.data());
    horizontal_row<3>(in, out, done, out_w, ksize, h.bounds.data(), h.weights.data());
  }
  return true;
#else
  (void)channels, (void)src, (void)src_stride, (void)first_row, (void)rows, (void)dst, (void)dst_stride, (void)src_w,
      (void)out_w;
  return false;
#endif
}

void Resampler::resize(const uint8_t* src, int src_h, int src_w, int channels, size_t src_stride,
                       double x0, double y0, double x1, double y1, uint8_t* dst, int dst_h,
                       int dst_w, size_t dst_stride, bool horizontal_first) {
  // Pillow skips a pass whose axis keeps its size and box.
  const bool need_h = dst_w != src_w || x0 != 0.0 || x1 != src_w;
  const bool need_v = dst_h != src_h || y0 != 0.0 || y1 != src_h;
  compute(src_w, x0, x1, dst_w, &horizontal_);
  compute(src_h, y0, y1, dst_h, &vertical_);
  if (!need_h && !need_v) {  // a plain copy
    for (int y = 0; y < dst_h; ++y)
      std::memcpy(dst + y * dst_stride, src + y * src_stride, static_cast<size_t>(src_w) * channels);
    return;
  }
  const size_t out_row = static_cast<size_t>(dst_w) * channels;

  if (!horizontal_first) {  // vertical over every source column, then horizontal
    const uint8_t* hsrc = src;
    size_t hstride = src_stride;
    if (need_v) {
      const size_t tstride = static_cast<size_t>(src_w) * channels;
      uint8_t* out = dst;
      size_t ostride = dst_stride;
      if (need_h) {
        temp_.resize(tstride * dst_h);
        out = temp_.data();
        ostride = tstride;
      }
      vertical_pass(src, src_stride, 0, out, ostride, dst_h, static_cast<int>(tstride), vertical_.ksize,
                    vertical_.bounds.data(), vertical_.weights.data(), &acc_);
      if (!need_h) return;
      hsrc = temp_.data();
      hstride = tstride;
    }
    run_horizontal(channels, hsrc, hstride, 0, dst_h, dst, dst_stride, src_w, dst_w);
    return;
  }

  // horizontal over the rows the vertical pass reads, then vertical
  if (!need_v) {
    run_horizontal(channels, src, src_stride, 0, src_h, dst, dst_stride, src_w, dst_w);
    return;
  }
  const uint8_t* vsrc = src;
  size_t vstride = src_stride;
  int row_offset = 0;
  if (need_h) {
    const int* vb = vertical_.bounds.data();
    const int first = vb[0], last = vb[2 * dst_h - 2] + vb[2 * dst_h - 1];
    temp_.resize(out_row * (last - first));
    run_horizontal(channels, src, src_stride, first, last - first, temp_.data(), out_row, src_w, dst_w);
    vsrc = temp_.data();
    vstride = out_row;
    row_offset = first;
  }
  vertical_pass(vsrc, vstride, row_offset, dst, dst_stride, dst_h, (need_h ? dst_w : src_w) * channels,
                vertical_.ksize, vertical_.bounds.data(), vertical_.weights.data(), &acc_);
}

void Resampler::run_horizontal(int channels, const uint8_t* src, size_t src_stride, int first_row, int rows,
                               uint8_t* dst, size_t dst_stride, int src_w, int dst_w) {
  if (!horizontal_rgb_fast(channels, src, src_stride, first_row, rows, dst, dst_stride, src_w, dst_w))
    horizontal_pass(channels, src, src_stride, first_row, rows, dst, dst_stride, dst_w, horizontal_.ksize,
                    horizontal_.bounds.data(), horizontal_.weights.data());
}

}  // namespace gpupipe
