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

// The out_w outputs of one row.
template <int C>
inline void horizontal_row(const uint8_t* in, uint8_t* out, int out_w, int ksize, const int* bounds,
                           const int32_t* weights) {
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

template <int C>
inline void horizontal_pass_impl(const uint8_t* src, size_t src_stride, int first_row, int rows, uint8_t* dst,
                                 size_t dst_stride, int out_w, int ksize, const int* bounds,
                                 const int32_t* weights) {
  for (int y = 0; y < rows; ++y)
    horizontal_row<C>(src + static_cast<size_t>(first_row + y) * src_stride, dst + static_cast<size_t>(y) * dst_stride,
                      out_w, ksize, bounds, weights);
}

#if GPUPIPE_X86_LEVELS
// The RGB horizontal pass, four outputs of two rows at a time. Each output's taps are consecutive
// pixels: one 16-byte load per row (its "window", five pixels) holds them, the row's in the low
// 128 bits and the next row's in the high. Tap i is then one byte shuffle (pixel i's R, G, B into
// three int32 lanes, the fourth 0) and one exact int32 multiply-add by the output's weight, the same
// for both rows: bit-identical to the scalar loop, whose int32 sums any order gives. The outputs'
// sums are packed as clip8 (the arithmetic shift, then int32 -> int16 -> uint8 with saturation:
// negative sums 0, sums of 2^30 or more 255) and stored as 12 bytes a row.
// Against eight outputs of one row a tap, each gathered with eight scalar loads: 1.3-1.8x faster at
// the ratios DCT scaling leaves (up to 2), 1.2-1.5x at 2-7 (measured, Zen 3), and the outputs near
// the row's end need no scalar loop (their windows are read from a zero-padded copy of the row's end).
constexpr int kWindowPixels = 5;   // taps a 16-byte load holds (15 bytes)
constexpr int kWindowStride = 15;  // bytes between an output's windows (past five taps)

// The bytes an output's windows read from its first one's start, for `taps` taps.
constexpr int window_reach(int taps) {
  return kWindowStride * ((taps + kWindowPixels - 1) / kWindowPixels - 1) + 16;
}

struct RgbWindows {
  const int32_t* offset;     // per output: its window's first byte in the row (3 * its first tap)
  const uint8_t* in_tail;    // per output: its windows pass the row's end (read from the copy)
  int taps;                  // taps of every output: the most of any
  const int32_t* weights;    // per output: ksize weights
  int ksize, out_w, tail_from;  // tail_from: the row's byte the copy starts at
};

GPUPIPE_TARGET_AVX2 inline __m256i pixel_shuffle(int i) {  // pixel i of a window into int32 lanes 0..2
  const __m128i c = _mm_setr_epi8(static_cast<char>(3 * i), -1, -1, -1, static_cast<char>(3 * i + 1), -1, -1, -1,
                                  static_cast<char>(3 * i + 2), -1, -1, -1, -1, -1, -1, -1);
  return _mm256_broadcastsi128_si256(c);
}

// One output's sums in both rows: `taps` taps from its windows (five pixels each, 15 bytes apart).
template <int kTaps>  // 1..10: unrolled (measured 1.3x at 6-10 taps); 0: any number
GPUPIPE_TARGET_AVX2 inline __m256i rgb_output(const uint8_t* w0, const uint8_t* w1, const int32_t* k, int taps,
                                              const __m256i* shuffles) {
  __m256i acc = _mm256_set1_epi32(1 << (kPrecisionBits - 1));
  const int n = kTaps > 0 ? kTaps : taps;
  for (int first = 0; first < n; first += kWindowPixels, w0 += kWindowStride, w1 += kWindowStride) {
    const __m256i win = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(w1), reinterpret_cast<const __m128i*>(w0));
    const int m = std::min(kWindowPixels, n - first);
#pragma GCC unroll 5
    for (int i = 0; i < m; ++i)
      acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(_mm256_shuffle_epi8(win, shuffles[i]), _mm256_set1_epi32(k[first + i])));
  }
  return _mm256_srai_epi32(acc, kPrecisionBits);
}

template <int kTaps>
GPUPIPE_TARGET_AVX2 inline void rgb_four(const RgbWindows& g, int x, const uint8_t* row0, const uint8_t* row1,
                                         const uint8_t* tail0, const uint8_t* tail1, uint8_t* out0, uint8_t* out1,
                                         const __m256i* shuffles) {
  __m256i sums[4];
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const int o = g.offset[x + j];
    const bool tail = g.in_tail[x + j];
    sums[j] = rgb_output<kTaps>(tail ? tail0 + (o - g.tail_from) : row0 + o, tail ? tail1 + (o - g.tail_from) : row1 + o,
                                g.weights + static_cast<size_t>(x + j) * g.ksize, g.taps, shuffles);
  }
  const __m256i pack = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,  //
                                        0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
  const __m256i rgb = _mm256_shuffle_epi8(
      _mm256_packus_epi16(_mm256_packs_epi32(sums[0], sums[1]), _mm256_packs_epi32(sums[2], sums[3])), pack);
  const __m128i lo = _mm256_castsi256_si128(rgb), hi = _mm256_extracti128_si256(rgb, 1);
  uint8_t* o0 = out0 + static_cast<size_t>(x) * 3;
  uint8_t* o1 = out1 + static_cast<size_t>(x) * 3;
  _mm_storel_epi64(reinterpret_cast<__m128i*>(o0), lo);
  const int32_t t0 = _mm_extract_epi32(lo, 2);
  std::memcpy(o0 + 8, &t0, 4);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(o1), hi);
  const int32_t t1 = _mm_extract_epi32(hi, 2);
  std::memcpy(o1 + 8, &t1, 4);
}

// Rows row0 and row1 (the same row for an odd one out: both lanes then write the same bytes).
template <int kTaps>
GPUPIPE_TARGET_AVX2 void rgb_rows(const RgbWindows& g, const uint8_t* row0, const uint8_t* row1, const uint8_t* tail0,
                                  const uint8_t* tail1, uint8_t* out0, uint8_t* out1) {
  __m256i shuffles[kWindowPixels];
  for (int i = 0; i < kWindowPixels; ++i) shuffles[i] = pixel_shuffle(i);
  for (int x0 = 0; x0 < g.out_w; x0 += 4) {
    const int x = std::min(x0, g.out_w - 4);  // the last four overlap the ones before: the same bytes again
    rgb_four<kTaps>(g, x, row0, row1, tail0, tail1, out0, out1, shuffles);
  }
}

// The rows of one call, every output with the row's most taps (weights past an output's count are
// 0): one count for all, no branch per output that a count varying along the row would mispredict.
GPUPIPE_TARGET_AVX2 void rgb_pass(const RgbWindows& g, int taps, const uint8_t* row0, const uint8_t* row1,
                                  const uint8_t* tail0, const uint8_t* tail1, uint8_t* out0, uint8_t* out1) {
  switch (taps > 10 ? 0 : taps) {
    case 1: rgb_rows<1>(g, row0, row1, tail0, tail1, out0, out1); break;
    case 2: rgb_rows<2>(g, row0, row1, tail0, tail1, out0, out1); break;
    case 3: rgb_rows<3>(g, row0, row1, tail0, tail1, out0, out1); break;
    case 4: rgb_rows<4>(g, row0, row1, tail0, tail1, out0, out1); break;
    case 5: rgb_rows<5>(g, row0, row1, tail0, tail1, out0, out1); break;
    case 6: rgb_rows<6>(g, row0, row1, tail0, tail1, out0, out1); break;
    case 7: rgb_rows<7>(g, row0, row1, tail0, tail1, out0, out1); break;
    case 8: rgb_rows<8>(g, row0, row1, tail0, tail1, out0, out1); break;
    case 9: rgb_rows<9>(g, row0, row1, tail0, tail1, out0, out1); break;
    case 10: rgb_rows<10>(g, row0, row1, tail0, tail1, out0, out1); break;
    default: rgb_rows<0>(g, row0, row1, tail0, tail1, out0, out1); break;
  }
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

#if GPUPIPE_X86_LEVELS
// 8 * V bytes of one output row of the vertical pass: V 8-lane int32 sums kept in registers across
// the taps. The multiply-adds are exact int32 arithmetic, so any order gives the scalar loop's bits.
// clip8 is the arithmetic shift, then int32 -> int16 (in range: |sum| < 2^31 gives |sum >> 22| <
// 2^9) and int16 -> uint8 with unsigned saturation (negative sums 0, sums of 2^30 or more 255).
template <int V>
GPUPIPE_TARGET_AVX2 inline void vertical_bytes_avx2(const uint8_t* in, size_t stride, int taps, const int32_t* k,
                                                    uint8_t* out) {
  static_assert(V % 4 == 0, "32 output bytes per store");
  __m256i acc[V];
#pragma GCC unroll 8
  for (int v = 0; v < V; ++v) acc[v] = _mm256_set1_epi32(1 << (kPrecisionBits - 1));
  for (int i = 0; i < taps; ++i, in += stride) {
    const __m256i w = _mm256_set1_epi32(k[i]);
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      const __m256i px = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(in + 8 * v)));
      acc[v] = _mm256_add_epi32(acc[v], _mm256_mullo_epi32(px, w));
    }
  }
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // the packs' lane-wise dword order undone
#pragma GCC unroll 2
  for (int v = 0; v < V; v += 4) {
    const __m256i lo = _mm256_packs_epi32(_mm256_srai_epi32(acc[v], kPrecisionBits),
                                          _mm256_srai_epi32(acc[v + 1], kPrecisionBits));
    const __m256i hi = _mm256_packs_epi32(_mm256_srai_epi32(acc[v + 2], kPrecisionBits),
                                          _mm256_srai_epi32(acc[v + 3], kPrecisionBits));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8 * v),
                        _mm256_permutevar8x32_epi32(_mm256_packus_epi16(lo, hi), order));
  }
}

// One output row of the vertical pass, 64 bytes at a time, then 32: the compiled scalar loop loads
// and stores its accumulator row once per tap and turns clip8's branches into compares and blends
// (4x slower, measured); a 32-byte block pays the taps' loop twice as often (1.6x slower). Returns
// the bytes done (a multiple of 32); the scalar loop does the rest.
GPUPIPE_TARGET_AVX2 int vertical_row_avx2(const uint8_t* first, size_t stride, int taps, const int32_t* k,
                                          int row_bytes, uint8_t* out) {
  int b = 0;
  for (; b + 64 <= row_bytes; b += 64) vertical_bytes_avx2<8>(first + b, stride, taps, k, out + b);
  if (b + 32 <= row_bytes) {
    vertical_bytes_avx2<4>(first + b, stride, taps, k, out + b);
    b += 32;
  }
  return b;
}
#endif

// Vertical taps are applied a whole row at a time so the inner loop runs over contiguous bytes.
void vertical_pass(const uint8_t* src, size_t src_stride, int row_offset, uint8_t* dst, size_t dst_stride, int out_h,
                   int row_bytes, int ksize, const int* bounds, const int32_t* weights,
                   std::vector<int32_t>* acc_buf) {
  acc_buf->resize(row_bytes);
  int32_t* acc = acc_buf->data();
  dispatch([&]([[maybe_unused]] auto level) {
    for (int y = 0; y < out_h; ++y) {
      const uint8_t* first = src + static_cast<size_t>(bounds[2 * y] - row_offset) * src_stride;
      const int32_t* k = weights + static_cast<size_t>(y) * ksize;
      uint8_t* out = dst + static_cast<size_t>(y) * dst_stride;
      int done = 0;
#if GPUPIPE_X86_LEVELS
      if constexpr (isa::at_least<decltype(level)>(CpuLevel::kAvx2))
        done = vertical_row_avx2(first, src_stride, bounds[2 * y + 1], k, row_bytes, out);
#endif
      if (done < row_bytes)
        vertical_row(first + done, src_stride, bounds[2 * y + 1], k, row_bytes - done, acc, out + done);
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
  if (channels != 3 || out_w < 4 || cpu_level() < CpuLevel::kAvx2) return false;
  const Coeffs& h = horizontal_;
  const int row_bytes = 3 * src_w;
  // Every output reads `taps` taps (the most of any; weights past an output's count are 0, which
  // output_taps guarantees, as it does 1 <= count <= ksize with every tap inside the row).
  int taps = 1;
  for (int x = 0; x < out_w; ++x) taps = std::max(taps, h.bounds[2 * x + 1]);
  // An output whose windows would pass the row's end reads them from a zero-padded copy of the
  // row's last `span` bytes instead. Such an output starts after row_bytes - window_reach(taps) >=
  // row_bytes - span = tail_from, so it reads the copy from below `span` to below 2 * span.
  const int span = window_reach(h.ksize);
  const int tail_from = std::max(0, row_bytes - span);
  const size_t tail_bytes = static_cast<size_t>(2 * span);
  window_offset_.resize(out_w);
  window_in_tail_.resize(out_w);
  bool any_tail = false;
  for (int x = 0; x < out_w; ++x) {
    window_offset_[x] = 3 * h.bounds[2 * x];
    window_in_tail_[x] = window_offset_[x] + window_reach(taps) > row_bytes;
    any_tail = any_tail || window_in_tail_[x];
  }
  const RgbWindows g{window_offset_.data(), window_in_tail_.data(), taps, h.weights.data(), h.ksize, out_w, tail_from};
  tail_.assign(2 * tail_bytes, 0);
  uint8_t* tail0 = tail_.data();
  uint8_t* tail1 = tail_.data() + tail_bytes;
  for (int y = 0; y < rows; y += 2) {
    const uint8_t* row0 = src + static_cast<size_t>(first_row + y) * src_stride;
    const uint8_t* row1 = y + 1 < rows ? row0 + src_stride : row0;
    if (any_tail) {
      std::memcpy(tail0, row0 + tail_from, static_cast<size_t>(row_bytes - tail_from));
      std::memcpy(tail1, row1 + tail_from, static_cast<size_t>(row_bytes - tail_from));
    }
    uint8_t* out0 = dst + static_cast<size_t>(y) * dst_stride;
    rgb_pass(g, taps, row0, row1, tail0, tail1, out0, y + 1 < rows ? out0 + dst_stride : out0);
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
