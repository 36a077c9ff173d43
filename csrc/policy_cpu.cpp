#include "policy_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "errors.h"
#include "multiversion.h"
#include "parallel_rows.h"
#include "thread_pool.h"

namespace gpupipe {
namespace {

using namespace policy;

// Rows are read and written in place, whatever the layout: pixel x of a row has its channels at
// x * sw + c * sc. The row kernels are templates on the layout, instantiated for channels-last rows
// (sc = 1, sw = 3, the decoder's output: compile-time strides, so the loops vectorise over
// interleaved pixels) and for any other strides.
struct ChannelsLast {
  static constexpr int64_t sc = 1, sw = 3;
};
struct AnyStrides {
  int64_t sc, sw;
};

template <typename L>
inline const uint8_t* pixel_at(const uint8_t* row, L l, int64_t x) {
  return row + x * l.sw;
}
template <typename L>
inline uint8_t* pixel_at(uint8_t* row, L l, int64_t x) {
  return row + x * l.sw;
}

inline const uint8_t* input_row(const PolicyArgs& a, int64_t n, int64_t y) {
  return a.input.data + n * a.input.stride[0] + y * a.input.stride[2];
}

// --- pass 1: per-sample statistics and lookup tables ---------------------------------------------

// Two histograms (even and odd pixels), summed by the caller: runs of equal values then do not
// serialise on one counter.
template <typename L>
GPUPIPE_MULTIVERSION void histogram_row(const uint8_t* __restrict__ row, L l, int64_t w,
                                        unsigned long long* __restrict__ hist) {
  unsigned long long* odd = hist + 768;
  int64_t x = 0;
  for (; x + 2 <= w; x += 2) {
    const uint8_t* p = pixel_at(row, l, x);
    const uint8_t* q = pixel_at(row, l, x + 1);
    ++hist[p[0]];
    ++hist[256 + p[l.sc]];
    ++hist[512 + p[2 * l.sc]];
    ++odd[q[0]];
    ++odd[256 + q[l.sc]];
    ++odd[512 + q[2 * l.sc]];
  }
  for (; x < w; ++x) {
    const uint8_t* p = pixel_at(row, l, x);
    ++hist[p[0]];
    ++hist[256 + p[l.sc]];
    ++hist[512 + p[2 * l.sc]];
  }
}

// Sum of gray_floor over a row: gray levels are integers 0..255, so the sum is exact.
template <typename L>
GPUPIPE_MULTIVERSION int64_t gray_sum_row(const uint8_t* __restrict__ row, L l, int64_t w) {
  int32_t sum = 0;  // at most 255 * w < 2^31 for w < 2^23
  for (int64_t x = 0; x < w; ++x) {
    const uint8_t* p = pixel_at(row, l, x);
    sum += static_cast<int32_t>(gray_floor(p[0], p[l.sc], p[2 * l.sc]));
  }
  return sum;
}

template <typename L>
void sample_stats(const PolicyArgs& a, int64_t n, L l, int32_t kind, unsigned long long* hist, int64_t* gray_sum) {
  for (int64_t y = 0; y < a.input.h; ++y) {
    if (needs_histogram(kind)) histogram_row(input_row(a, n, y), l, a.input.w, hist);
    else *gray_sum += gray_sum_row(input_row(a, n, y), l, a.input.w);
  }
}

void sample_table(const PolicyArgs& a, int64_t n, uint8_t* lut) {
  const int32_t kind = static_cast<int32_t>(a.kinds[n]);
  if (!is_lut_kind(kind)) return;
  Stats s;
  s.pixels = a.input.h * a.input.w;
  unsigned long long hist[2 * 3 * 256];
  if (needs_histogram(kind) || needs_gray_sum(kind)) {
    std::memset(hist, 0, sizeof(hist));
    const int64_t sc = a.input.stride[1], sw = a.input.stride[3];
    if (sc == 1 && sw == 3) sample_stats(a, n, ChannelsLast{}, kind, hist, &s.gray_sum);
    else sample_stats(a, n, AnyStrides{sc, sw}, kind, hist, &s.gray_sum);
    for (int i = 0; i < 768; ++i) hist[i] += hist[768 + i];
    s.hist = hist;
  }
  build_lut(kind, a.params[n], s, lut);
}

// --- pass 2: output rows ---------------------------------------------------------------------------

template <typename L>
GPUPIPE_MULTIVERSION void copy_row(const uint8_t* __restrict__ in, L li, uint8_t* __restrict__ out, L lo, int64_t w) {
  for (int64_t x = 0; x < w; ++x) {
    const uint8_t* p = pixel_at(in, li, x);
    uint8_t* q = pixel_at(out, lo, x);
    q[0] = p[0];
    q[lo.sc] = p[li.sc];
    q[2 * lo.sc] = p[2 * li.sc];
  }
}

template <typename L>
GPUPIPE_MULTIVERSION void lut_row(const uint8_t* __restrict__ in, L li, uint8_t* __restrict__ out, L lo, int64_t w,
                                  const uint8_t* __restrict__ lut) {
  const uint8_t *l0 = lut, *l1 = lut + 256, *l2 = lut + 512;
  int64_t x = 0;
  if constexpr (std::is_same<L, ChannelsLast>::value) {
    // 4 pixels at a time, stored as 3 words: byte stores of neighbouring channels would be merged
    // through partial registers, which stalls.
    for (; x + 4 <= w; x += 4) {
      const uint8_t* p = in + 3 * x;
      const uint32_t words[3] = {
          l0[p[0]] | uint32_t{l1[p[1]]} << 8 | uint32_t{l2[p[2]]} << 16 | uint32_t{l0[p[3]]} << 24,
          l1[p[4]] | uint32_t{l2[p[5]]} << 8 | uint32_t{l0[p[6]]} << 16 | uint32_t{l1[p[7]]} << 24,
          l2[p[8]] | uint32_t{l0[p[9]]} << 8 | uint32_t{l1[p[10]]} << 16 | uint32_t{l2[p[11]]} << 24};
      std::memcpy(out + 3 * x, words, 12);  // little-endian byte order, as the layout
    }
  }
  for (; x < w; ++x) {
    const uint8_t* p = pixel_at(in, li, x);
    uint8_t* q = pixel_at(out, lo, x);
    q[0] = l0[p[0]];
    q[lo.sc] = l1[p[li.sc]];
    q[2 * lo.sc] = l2[p[2 * li.sc]];
  }
}

// The direct point ops (is_direct_kind) over n contiguous bytes: one vectorised loop per kind.
GPUPIPE_MULTIVERSION void direct_bytes(int32_t kind, double param, const uint8_t* __restrict__ in,
                                       uint8_t* __restrict__ out, int64_t n) {
  switch (kind) {
    case kBrightness: {
      const float f = static_cast<float>(param);
      for (int64_t i = 0; i < n; ++i) out[i] = brightness_level(in[i], f);
      break;
    }
    case kPosterize: {
      const uint8_t mask = posterize_mask(param);
      for (int64_t i = 0; i < n; ++i) out[i] = in[i] & mask;
      break;
    }
    case kSolarize: {
      const float t = static_cast<float>(param);
      for (int64_t i = 0; i < n; ++i) out[i] = solarize_level(in[i], t);
      break;
    }
    default:  // kInvert
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(255 - in[i]);
  }
}

// adjust_saturation: each channel blended with the pixel's floored gray level.
template <typename L>
GPUPIPE_MULTIVERSION void color_row(const uint8_t* __restrict__ in, L li, uint8_t* __restrict__ out, L lo, int64_t w,
                                    Blend bl) {
  for (int64_t x = 0; x < w; ++x) {
    const uint8_t* p = pixel_at(in, li, x);
    uint8_t* q = pixel_at(out, lo, x);
    const float r = p[0], g = p[li.sc], b = p[2 * li.sc];
    const float gray = gray_floor(r, g, b);
    q[0] = blend_pixel(bl, r, gray);
    q[lo.sc] = blend_pixel(bl, g, gray);
    q[2 * lo.sc] = blend_pixel(bl, b, gray);
  }
}

// adjust_sharpness on an interior row (above, mid, below: its three input rows); the first and last
// pixels keep their values. A channel's horizontal neighbours are one pixel stride away.
template <typename L>
GPUPIPE_MULTIVERSION void sharpen_row(const uint8_t* __restrict__ above, const uint8_t* __restrict__ mid,
                                      const uint8_t* __restrict__ below, L li, uint8_t* __restrict__ out, L lo,
                                      int64_t w, float alpha) {
  if constexpr (std::is_same<L, ChannelsLast>::value) {  // interleaved: one flat loop over the bytes
    for (int64_t o = 3; o < 3 * (w - 1); ++o) {
      const int32_t sum9 = above[o - 3] + above[o] + above[o + 3] + mid[o - 3] + mid[o] + mid[o + 3] +
                           below[o - 3] + below[o] + below[o + 3];
      out[o] = sharpen_pixel(sum9, mid[o], alpha);
    }
  } else {
    for (int c = 0; c < 3; ++c) {
      const int64_t s = li.sw;
      for (int64_t x = 1; x + 1 < w; ++x) {
        const int64_t o = x * s + c * li.sc;
        const int32_t sum9 = above[o - s] + above[o] + above[o + s] + mid[o - s] + mid[o] + mid[o + s] +
                             below[o - s] + below[o] + below[o + s];
        out[x * lo.sw + c * lo.sc] = sharpen_pixel(sum9, mid[o], alpha);
      }
    }
  }
  for (int64_t x : {int64_t{0}, w - 1})
    for (int c = 0; c < 3; ++c) out[x * lo.sw + c * lo.sc] = mid[x * li.sw + c * li.sc];
}

template <typename L>
inline void store_pixel(uint8_t* q, L l, const uint8_t* value) {
  q[0] = value[0];
  q[l.sc] = value[1];
  q[2 * l.sc] = value[2];
}

// A map that only translates by whole pixels (|shift| < 2^24, where floats are exact integers).
inline bool integer_shift(const float* m) {
  return m[0] == 1.0f && m[1] == 0.0f && m[3] == 0.0f && m[4] == 1.0f && std::fabs(m[2]) < 16777216.0f &&
         std::fabs(m[5]) < 16777216.0f && m[2] == std::nearbyint(m[2]) && m[5] == std::nearbyint(m[5]);
}

// Whether a map reads other input rows than the output row's (not a horizontal shear or shift),
// which makes its reads leave the hardware prefetcher's sequential pattern.
inline bool reads_across_rows(const float* m) {
  return !(m[3] == 0.0f && m[4] == 1.0f && m[5] == 0.0f) && !integer_shift(m);
}

// Reads a sample's image into the cache (one byte per line, in order, which the hardware prefetcher
// follows) before a warp reads it out of order: a rotation reads along slanted lines, and those
// misses cost more than this scan. Prefetch instructions alone were measured to help less.
inline void touch_image(const pixel::Image8& im) {
  const int64_t row_bytes = (im.w - 1) * im.sx + 2 * im.sc + 1;
  uint8_t acc = 0;
  for (int64_t y = 0; y < im.h; ++y)
    for (int64_t o = 0; o < row_bytes; o += 64) acc ^= im.data[y * im.sy + o];
  asm volatile("" : : "r"(acc));  // keep the loads
}

// The geometric ops: each output pixel samples the input through the sample's inverse affine map
// (augment_pixel.h, the warp shared with warp_affine and the CUDA kernels). Nearest, the common
// case, in two loops: the row's source pixels (vectorised), then the gather.
template <typename L>
GPUPIPE_MULTIVERSION void affine_row(const PolicyArgs& a, int64_t n, int64_t y, uint8_t* __restrict__ out, L lo,
                                     int32_t* __restrict__ columns, int32_t* __restrict__ rows) {
  const pixel::Image8 im = a.input.sample(n);
  const float* m = a.matrices + 6 * n;
  const int32_t w = static_cast<int32_t>(a.input.w);  // < 2^24 (augment_bindings.h)
  const float fy = static_cast<float>(y);
  uint8_t fill[3];
  for (int c = 0; c < 3; ++c) fill[c] = a.fill.enabled ? pixel::to_uint8(a.fill.value[c]) : 0;
  if (a.interpolation == pixel::kNearest && integer_shift(m)) {
    // TranslateX/Y: every coordinate is an exact integer (x + m2, y + m5), so the warp is a shifted copy.
    const int64_t dx = static_cast<int64_t>(m[2]), sy = y + static_cast<int64_t>(m[5]);
    const int64_t begin = std::clamp<int64_t>(-dx, 0, w), end = std::clamp<int64_t>(w - dx, begin, w);
    const bool row_inside = sy >= 0 && sy < a.input.h;
    const uint8_t* src = im.data + sy * im.sy;
    const int64_t first = row_inside ? begin : w, last = row_inside ? end : w;
    for (int64_t x = 0; x < first; ++x) store_pixel(pixel_at(out, lo, x), lo, fill);
    for (int64_t x = first; x < last; ++x) {
      const uint8_t* p = src + (x + dx) * im.sx;
      uint8_t* q = pixel_at(out, lo, x);
      q[0] = p[0];
      q[lo.sc] = p[im.sc];
      q[2 * lo.sc] = p[2 * im.sc];
    }
    for (int64_t x = last; x < w; ++x) store_pixel(pixel_at(out, lo, x), lo, fill);
    return;
  }
  if (a.interpolation == pixel::kNearest) {
    for (int32_t x = 0; x < w; ++x) {
      float sx, sy;
      pixel::affine_source(m, static_cast<float>(x), fy, &sx, &sy);
      pixel::nearest_pixel(im, sx, sy, columns + x, rows + x);
    }
    for (int32_t x = 0; x < w; ++x) {
      uint8_t* q = pixel_at(out, lo, x);
      if (columns[x] >= 0) {
        const uint8_t* p = im.data + static_cast<int64_t>(rows[x]) * im.sy + static_cast<int64_t>(columns[x]) * im.sx;
        q[0] = p[0];
        q[lo.sc] = p[im.sc];
        q[2 * lo.sc] = p[2 * im.sc];
      } else {
        store_pixel(q, lo, fill);
      }
    }
    return;
  }
  for (int32_t x = 0; x < w; ++x) {
    float sx, sy, v[3];
    pixel::affine_source(m, static_cast<float>(x), fy, &sx, &sy);
    pixel::sample(im, a.interpolation, a.fill, sx, sy, v);
    uint8_t* q = pixel_at(out, lo, x);
    q[0] = pixel::to_uint8(v[0]);
    q[lo.sc] = pixel::to_uint8(v[1]);
    q[2 * lo.sc] = pixel::to_uint8(v[2]);
  }
}

template <typename L>
void output_row(const PolicyArgs& a, const uint8_t* luts, int64_t n, int64_t y, L li, L lo,
                std::vector<int32_t>& scratch) {
  const int64_t w = a.input.w, h = a.input.h;
  const int32_t kind = static_cast<int32_t>(a.kinds[n]);
  const uint8_t* in = input_row(a, n, y);
  uint8_t* out = a.output_row(n, y);
  if (kind == kAffine) {
    scratch.resize(static_cast<size_t>(2 * w));
    affine_row(a, n, y, out, lo, scratch.data(), scratch.data() + w);
  } else if (kind == kSharpness && y > 0 && y + 1 < h && w > 2) {
    sharpen_row(input_row(a, n, y - 1), in, input_row(a, n, y + 1), li, out, lo, w,
                static_cast<float>(1.0 - a.params[n]));
  } else if (is_direct_kind(kind) && std::is_same<L, ChannelsLast>::value) {
    direct_bytes(kind, a.params[n], in, out, 3 * w);
  } else if (is_lut_kind(kind) && kind != kIdentity) {
    lut_row(in, li, out, lo, w, luts + 768 * n);
  } else if (kind == kColor) {
    color_row(in, li, out, lo, w, make_blend(a.params[n]));
  } else {  // kIdentity, and kSharpness on border rows: the input row as is
    copy_row(in, li, out, lo, w);
  }
}

}  // namespace

void policy_apply_cpu(const PolicyArgs& a, int num_threads) {
  const int64_t n = a.input.n, h = a.input.h;
  if (n == 0 || h == 0 || a.input.w == 0) return;
  std::vector<uint8_t> luts(static_cast<size_t>(n) * 768);
  const int64_t* is = a.input.stride;
  const int64_t* os = a.out_stride;
  const bool channels_last = is[1] == 1 && is[3] == 3 && os[1] == 1 && os[3] == 3;
  // Rows [begin, end) of the batch (row r: sample r / h, row r % h).
  auto rows = [&](int64_t begin, int64_t end) {
    thread_local std::vector<int32_t> scratch;
    for (int64_t r = begin; r < end; ++r) {
      if ((r == begin || r % h == 0) && a.kinds[r / h] == kAffine && reads_across_rows(a.matrices + 6 * (r / h)))
        touch_image(a.input.sample(r / h));
      if (channels_last) output_row(a, luts.data(), r / h, r % h, ChannelsLast{}, ChannelsLast{}, scratch);
      else output_row(a, luts.data(), r / h, r % h, AnyStrides{is[1], is[3]}, AnyStrides{os[1], os[3]}, scratch);
    }
  };
  auto table = [&](size_t i) { sample_table(a, static_cast<int64_t>(i), luts.data() + 768 * i); };
  if (num_threads <= 1 || n >= 4LL * num_threads) {
    // Enough samples to share out: one task per sample, its statistics then its rows, so a
    // histogram op reads its image a second time from the cache, not from memory.
    auto sample = [&](size_t i) {
      table(i);
      rows(static_cast<int64_t>(i) * h, static_cast<int64_t>(i + 1) * h);
    };
    if (num_threads <= 1) {
      for (int64_t i = 0; i < n; ++i) sample(static_cast<size_t>(i));
    } else {
      get_pool(num_threads)->parallel_for(static_cast<size_t>(n), sample);
    }
    return;
  }
  // Few, large samples: the tables first, then the rows of all samples shared out.
  get_pool(num_threads)->parallel_for(static_cast<size_t>(n), table);
  parallel_rows(n * h, num_threads, rows);
}

}  // namespace gpupipe
