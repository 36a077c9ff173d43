#include "augment/policy_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/errors.h"
#include "common/multiversion.h"
#include "common/parallel_rows.h"
#include "common/simd_avx512.h"
#include "common/thread_pool.h"

namespace gpupipe {
namespace {

using namespace policy;

// Every row kernel is a template on the instruction set (multiversion.h): dispatch() runs a pass's
// rows built for the CPU's widest level. Isa::fma picks the fused multiply-add instruction for the
// row math that is fused multiply-adds (color, contrast's gray sum, sharpness): it gives the bits
// the baseline build computes through double (policy_ops.h, fma_small), in a third of the
// instructions.
#define POLICY_INLINE inline __attribute__((always_inline))

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

// --- statistics rows ----------------------------------------------------------------------------------

// Up to four 32-bit histograms (channels-last rows: pixel x in copy x % 4; other strides: x % 2),
// summed by the caller: runs of equal values then do not serialise on one counter (an increment
// waits for the last store to its counter). Channels-last rows are read 4 pixels (12 bytes) per 8-
// and 4-byte load, the bytes taken out by shifts: about one memory read per byte fewer than byte
// loads, and this loop is bound by its memory reads and writes.
constexpr int kHistCopies = 4;
template <typename L>
POLICY_INLINE void histogram_row(const uint8_t* __restrict__ row, L l, int64_t w, uint32_t* __restrict__ hist) {
  uint32_t* __restrict__ h1 = hist + 768;
  uint32_t* __restrict__ h2 = hist + 2 * 768;
  uint32_t* __restrict__ h3 = hist + 3 * 768;
  int64_t x = 0;
  if constexpr (std::is_same<L, ChannelsLast>::value) {
    for (; x + 4 <= w; x += 4) {
      uint64_t a;
      uint32_t b;
      std::memcpy(&a, row + 3 * x, 8);  // little-endian: byte i of the row is bits 8i..8i+7
      std::memcpy(&b, row + 3 * x + 8, 4);
      ++hist[a & 255];
      ++hist[256 + ((a >> 8) & 255)];
      ++hist[512 + ((a >> 16) & 255)];
      ++h1[(a >> 24) & 255];
      ++h1[256 + ((a >> 32) & 255)];
      ++h1[512 + ((a >> 40) & 255)];
      ++h2[(a >> 48) & 255];
      ++h2[256 + (a >> 56)];
      ++h2[512 + (b & 255)];
      ++h3[(b >> 8) & 255];
      ++h3[256 + ((b >> 16) & 255)];
      ++h3[512 + (b >> 24)];
    }
  } else {
    for (; x + 2 <= w; x += 2) {
      const uint8_t* p = pixel_at(row, l, x);
      const uint8_t* q = pixel_at(row, l, x + 1);
      ++hist[p[0]];
      ++hist[256 + p[l.sc]];
      ++hist[512 + p[2 * l.sc]];
      ++h1[q[0]];
      ++h1[256 + q[l.sc]];
      ++h1[512 + q[2 * l.sc]];
    }
  }
  for (; x < w; ++x) {
    const uint8_t* p = pixel_at(row, l, x);
    ++hist[p[0]];
    ++hist[256 + p[l.sc]];
    ++hist[512 + p[2 * l.sc]];
  }
}

// Sum of gray_floor over a row: gray levels are integers 0..255, so the sum is exact.
template <typename Isa, typename L>
POLICY_INLINE int64_t gray_sum_row(const uint8_t* __restrict__ row, L l, int64_t w) {
  int32_t sum = 0;  // at most 255 * w < 2^31 for w < 2^23
  for (int64_t x = 0; x < w; ++x) {
    const uint8_t* p = pixel_at(row, l, x);
    sum += static_cast<int32_t>(gray_floor<Isa::fma>(p[0], p[l.sc], p[2 * l.sc]));
  }
  return sum;
}
// --- output rows -------------------------------------------------------------------------------------

template <typename L>
POLICY_INLINE void copy_row(const uint8_t* __restrict__ in, L li, uint8_t* __restrict__ out, L lo, int64_t w) {
  for (int64_t x = 0; x < w; ++x) {
    const uint8_t* p = pixel_at(in, li, x);
    uint8_t* q = pixel_at(out, lo, x);
    q[0] = p[0];
    q[lo.sc] = p[li.sc];
    q[2 * lo.sc] = p[2 * li.sc];
  }
}

template <typename L>
POLICY_INLINE void lut_row_scalar(const uint8_t* __restrict__ in, L li, uint8_t* __restrict__ out, L lo, int64_t w,
                                  const uint8_t* __restrict__ lut) {
  const uint8_t *l0 = lut, *l1 = lut + 256, *l2 = lut + 512;
  int64_t x = 0;
  if constexpr (std::is_same<L, ChannelsLast>::value) {
    // 4 pixels at a time, stored as 3 words: byte stores of neighbouring channels would be merged
    // through partial registers, which stalls.
    for (; x + 4 <= w; x += 4) {
      const uint8_t* p = in + 3 * x;
      const uint32_t w0 = l0[p[0]] | uint32_t{l1[p[1]]} << 8 | uint32_t{l2[p[2]]} << 16 | uint32_t{l0[p[3]]} << 24;
      const uint32_t w1 = l1[p[4]] | uint32_t{l2[p[5]]} << 8 | uint32_t{l0[p[6]]} << 16 | uint32_t{l1[p[7]]} << 24;
      const uint32_t w2 = l2[p[8]] | uint32_t{l0[p[9]]} << 8 | uint32_t{l1[p[10]]} << 16 | uint32_t{l2[p[11]]} << 24;
      std::memcpy(out + 3 * x, &w0, 4);  // little-endian byte order, as the layout
      std::memcpy(out + 3 * x + 4, &w1, 4);
      std::memcpy(out + 3 * x + 8, &w2, 4);
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

// A row through its channel tables: AVX-512 VBMI looks 64 bytes up per few byte permutes
// (simd_avx512.h); other levels and layouts byte by byte. one_table: the three tables are equal.
template <typename Isa, typename L>
POLICY_INLINE void lut_row(const uint8_t* in, L li, uint8_t* out, L lo, int64_t w, const uint8_t* lut, bool one_table) {
  if constexpr (isa::at_least<Isa>(CpuLevel::kAvx512Vbmi) && std::is_same<L, ChannelsLast>::value) {
    if (one_table) simd::lut_bytes_vbmi(in, out, 3 * w, lut);
    else simd::lut_channels_vbmi(in, out, 3 * w, lut);
  } else {
    (void)one_table;
    lut_row_scalar(in, li, out, lo, w, lut);
  }
}

// The direct point ops (is_direct_kind) over n contiguous bytes: one vectorised loop per kind.
POLICY_INLINE void direct_bytes(int32_t kind, double param, const uint8_t* __restrict__ in,
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
    case kSolarize: {  // solarize_level, with the threshold as a level: a byte compare
      const int first = solarize_first_level(static_cast<float>(param));
      if (first > 255) {
        std::memcpy(out, in, static_cast<size_t>(n));
        break;
      }
      const uint8_t t = static_cast<uint8_t>(first);
      for (int64_t i = 0; i < n; ++i) out[i] = in[i] >= t ? static_cast<uint8_t>(255 - in[i]) : in[i];
      break;
    }
    case kInvert:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(255 - in[i]);
      break;
    default:  // kIdentity inside a run
      std::memcpy(out, in, static_cast<size_t>(n));
  }
}

// adjust_saturation: each channel blended with the pixel's floored gray level.
template <typename Isa, typename L>
POLICY_INLINE void color_row(const uint8_t* __restrict__ in, L li, uint8_t* __restrict__ out, L lo, int64_t w,
                             Blend bl) {
  for (int64_t x = 0; x < w; ++x) {
    const uint8_t* p = pixel_at(in, li, x);
    uint8_t* q = pixel_at(out, lo, x);
    const float r = p[0], g = p[li.sc], b = p[2 * li.sc];
    const float gray = gray_floor<Isa::fma>(r, g, b);
    q[0] = blend_pixel<Isa::fma>(bl, r, gray);
    q[lo.sc] = blend_pixel<Isa::fma>(bl, g, gray);
    q[2 * lo.sc] = blend_pixel<Isa::fma>(bl, b, gray);
  }
}
// adjust_sharpness on an interior row (above, mid, below: its three input rows); the first and last
// pixels keep their values. A channel's horizontal neighbours are one pixel stride away.
template <typename Isa, typename L>
POLICY_INLINE void sharpen_row(const uint8_t* __restrict__ above, const uint8_t* __restrict__ mid,
                               const uint8_t* __restrict__ below, L li, uint8_t* __restrict__ out, L lo, int64_t w,
                               float alpha) {
  if constexpr (std::is_same<L, ChannelsLast>::value) {  // interleaved: one flat loop over the bytes
    for (int64_t o = 3; o < 3 * (w - 1); ++o) {
      const int32_t sum9 = above[o - 3] + above[o] + above[o + 3] + mid[o - 3] + mid[o] + mid[o + 3] +
                           below[o - 3] + below[o] + below[o + 3];
      out[o] = sharpen_pixel<Isa::fma>(sum9, mid[o], alpha);
    }
  } else {
    for (int c = 0; c < 3; ++c) {
      const int64_t s = li.sw;
      for (int64_t x = 1; x + 1 < w; ++x) {
        const int64_t o = x * s + c * li.sc;
        const int32_t sum9 = above[o - s] + above[o] + above[o + s] + mid[o - s] + mid[o] + mid[o + s] +
                             below[o - s] + below[o] + below[o + s];
        out[x * lo.sw + c * lo.sc] = sharpen_pixel<Isa::fma>(sum9, mid[o], alpha);
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
template <typename Isa, typename L>
POLICY_INLINE void affine_row(const PolicyArgs& a, const pixel::Image8& im, const float* m, int64_t y,
                              uint8_t* __restrict__ out, L lo, int32_t* __restrict__ columns,
                              int32_t* __restrict__ rows) {
  const int32_t w = static_cast<int32_t>(im.w);  // < 2^24 (augment_args.h)
  const float fy = static_cast<float>(y);
  uint8_t fill[3];
  for (int c = 0; c < 3; ++c) fill[c] = a.fill.enabled ? pixel::to_uint8(a.fill.value[c]) : 0;
  if (a.interpolation == pixel::kNearest && integer_shift(m)) {
    // TranslateX/Y: every coordinate is an exact integer (x + m2, y + m5), so the warp is a shifted copy.
    const int64_t dx = static_cast<int64_t>(m[2]), sy = y + static_cast<int64_t>(m[5]);
    const int64_t begin = std::clamp<int64_t>(-dx, 0, w), end = std::clamp<int64_t>(w - dx, begin, w);
    const bool row_inside = sy >= 0 && sy < im.h;
    const uint8_t* src = im.data + sy * im.sy;
    const int64_t first = row_inside ? begin : w, last = row_inside ? end : w;
    for (int64_t x = 0; x < first; ++x) store_pixel(pixel_at(out, lo, x), lo, fill);
    if (std::is_same<L, ChannelsLast>::value && im.sc == 1 && im.sx == 3) {
      if (last > first) std::memcpy(out + 3 * first, src + 3 * (first + dx), static_cast<size_t>(3 * (last - first)));
    } else {
      for (int64_t x = first; x < last; ++x) {
        const uint8_t* p = src + (x + dx) * im.sx;
        uint8_t* q = pixel_at(out, lo, x);
        q[0] = p[0];
        q[lo.sc] = p[im.sc];
        q[2 * lo.sc] = p[2 * im.sc];
      }
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
    int32_t x = 0;
    if (std::is_same<L, ChannelsLast>::value && im.sc == 1 && im.sx == 3) {
      // Pixels move as 4-byte words (the 4th byte is the next pixel's, rewritten next), except
      // reads of an input row's last pixel and the output row's last write, which stay in bounds.
      uint32_t fill_word = 0;
      std::memcpy(&fill_word, fill, 3);
      if constexpr (isa::at_least<Isa>(CpuLevel::kAvx512))
        if ((im.h - 1) * im.sy + 3 * im.w < (int64_t{1} << 31))  // the largest gathered offset + 4 bytes
          x = simd::gather_pixels_avx512(im.data, static_cast<int32_t>(im.sy), w, columns, rows, w, fill_word, out);
      for (; x + 1 < w; ++x) {
        uint32_t v = fill_word;
        if (columns[x] >= 0) {
          const uint8_t* p = im.data + static_cast<int64_t>(rows[x]) * im.sy + 3 * static_cast<int64_t>(columns[x]);
          if (columns[x] + 1 < w) std::memcpy(&v, p, 4);
          else v = uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16;
        }
        std::memcpy(out + 3 * x, &v, 4);
      }
    }
    for (; x < w; ++x) {
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

// --- per-sample pipelines ------------------------------------------------------------------------------

// A 3-channel uint8 image a pass writes: a sample's output, or a scratch image (channels-last).
struct Target {
  uint8_t* data;
  int64_t sc, sy, sx;
  uint8_t* row(int64_t y) const { return data + y * sy; }
};

// Two channels-last images a sample's intermediate results alternate between.
struct Scratch {
  std::vector<uint8_t> images[2];
  std::vector<int32_t> ints;
};

// One pass over a sample: its steps [first, last), either a run of table ops folded into one table
// (lut), or one other op (color, sharpness, a warp).
struct Pass {
  int64_t first, last;
  bool lut;
};

// Splits a sample's steps into passes. Consecutive table ops fold into one pass: the histogram of a
// table's output is its input histogram remapped, so equalize and autocontrast after another table
// op need no pass of their own; contrast, whose table needs the gray mean of its input, only starts
// a run. Identity steps need nothing.
void plan(const int64_t* kinds, int64_t slots, std::vector<Pass>& passes) {
  passes.clear();
  for (int64_t i = 0; i < slots;) {
    const int32_t k = static_cast<int32_t>(kinds[i]);
    if (k == kIdentity) {
      ++i;
    } else if (is_lut_kind(k)) {
      int64_t j = i + 1;
      while (j < slots && is_lut_kind(static_cast<int32_t>(kinds[j])) && kinds[j] != kContrast) ++j;
      passes.push_back({i, j, true});
      i = j;
    } else {
      passes.push_back({i, i + 1, false});
      ++i;
    }
  }
}

// The channel histograms (counts, [3][256]) and the gray sum of an image. The 32-bit copies are
// added into `counts` every `chunk` rows, before any counter could wrap (a copy counts at most w
// values of a row).
template <typename Isa, typename L>
void stats_rows(const pixel::Image8& im, L l, bool hist, bool gray, unsigned long long* counts, int64_t* gray_sum) {
  uint32_t copies[kHistCopies * 768];
  const int64_t chunk = std::max<int64_t>(1, int64_t{0xffffffff} / std::max<int64_t>(1, im.w));
  for (int64_t y0 = 0; y0 < im.h; y0 += chunk) {
    const int64_t y1 = std::min(im.h, y0 + chunk);
    if (hist) std::memset(copies, 0, sizeof(copies));
    for (int64_t y = y0; y < y1; ++y) {
      const uint8_t* row = im.data + y * im.sy;
      if (hist) histogram_row(row, l, im.w, copies);
      if (gray) *gray_sum += gray_sum_row<Isa>(row, l, im.w);
    }
    if (hist)
      for (int i = 0; i < 768; ++i)
        counts[i] += uint64_t{copies[i]} + copies[768 + i] + copies[2 * 768 + i] + copies[3 * 768 + i];
  }
}

// The folded table of a run of table ops over `im`: the statistics of `im` once, then each op's
// table from the statistics of its own input (the histogram remapped through the tables before it).
void fold_tables(const pixel::Image8& im, const int64_t* kinds, const double* params, const Pass& p, uint8_t* lut) {
  bool hist = false;
  for (int64_t i = p.first; i < p.last; ++i)
    hist |= needs_histogram(static_cast<int32_t>(kinds[i])) || needs_range(static_cast<int32_t>(kinds[i]));
  const bool gray = kinds[p.first] == kContrast;
  unsigned long long counts[768] = {};
  Stats s;
  s.pixels = im.h * im.w;
  if (hist || gray) {
    dispatch([&](auto isa) {
      using Isa = decltype(isa);
      if (im.sc == 1 && im.sx == 3) stats_rows<Isa>(im, ChannelsLast{}, hist, gray, counts, &s.gray_sum);
      else stats_rows<Isa>(im, AnyStrides{im.sc, im.sx}, hist, gray, counts, &s.gray_sum);
    });
  }
  for (int i = 0; i < 768; ++i) lut[i] = static_cast<uint8_t>(i & 255);
  uint8_t step[768];
  for (int64_t i = p.first; i < p.last; ++i) {
    const int32_t k = static_cast<int32_t>(kinds[i]);
    if (needs_range(k)) range_from_histogram(counts, &s);
    s.hist = counts;
    build_lut(k, params[i], s, step);
    for (int c = 0; c < 3; ++c)
      for (int v = 0; v < 256; ++v) lut[256 * c + v] = step[256 * c + lut[256 * c + v]];
    if (hist && i + 1 < p.last) {  // the next op's input histogram: this op's output's
      unsigned long long next[768] = {};
      for (int c = 0; c < 3; ++c)
        for (int v = 0; v < 256; ++v) next[256 * c + step[256 * c + v]] += counts[256 * c + v];
      std::memcpy(counts, next, sizeof(next));
    }
  }
}

// A run of direct point ops (run[i] = {kind, param}) over a row of n bytes: each op one vectorised
// loop, the intermediate rows in two small buffers.
inline void direct_run(const int64_t* kinds, const double* params, int64_t count, const uint8_t* in, uint8_t* out,
                       int64_t n) {
  thread_local std::vector<uint8_t> rows[2];
  const uint8_t* src = in;
  for (int64_t i = 0; i < count; ++i) {
    uint8_t* dst = out;
    if (i + 1 < count) {
      rows[i % 2].resize(static_cast<size_t>(n));
      dst = rows[i % 2].data();
    }
    direct_bytes(static_cast<int32_t>(kinds[i]), params[i], src, dst, n);
    src = dst;
  }
}

// Rows [y0, y1) of one pass from `im` into `dst`: a run of direct point ops (direct: its first
// `direct` steps), a table (lut), or one op.
template <typename Isa, typename L>
void pass_rows(const PolicyArgs& a, const pixel::Image8& im, const Target& dst, L li, L lo, int32_t kind,
               const int64_t* kinds, const double* params, const float* matrix, const uint8_t* lut, int64_t direct,
               int64_t y0, int64_t y1, std::vector<int32_t>& ints) {
  const int64_t w = im.w, h = im.h;
  const double param = params[0];
  const bool one_table =
      lut != nullptr && std::memcmp(lut, lut + 256, 256) == 0 && std::memcmp(lut, lut + 512, 256) == 0;
  for (int64_t y = y0; y < y1; ++y) {
    const uint8_t* in = im.data + y * im.sy;
    uint8_t* out = dst.row(y);
    if (direct) {
      direct_run(kinds, params, direct, in, out, 3 * w);
    } else if (lut != nullptr) {
      lut_row<Isa>(in, li, out, lo, w, lut, one_table);
    } else if (kind == kAffine) {
      ints.resize(static_cast<size_t>(2 * w));
      affine_row<Isa>(a, im, matrix, y, out, lo, ints.data(), ints.data() + w);
    } else if (kind == kColor) {
      color_row<Isa>(in, li, out, lo, w, make_blend(param));
    } else if (kind == kSharpness && y > 0 && y + 1 < h && w > 2) {
      sharpen_row<Isa>(in - im.sy, in, in + im.sy, li, out, lo, w, static_cast<float>(1.0 - param));
    } else {  // sharpness on border rows, identity
      copy_row(in, li, out, lo, w);
    }
  }
}

// A sample's rows, run by `rows(h, fn)`: fn(y0, y1, ints) over [0, h), inline or shared out.
template <typename Rows>
void run_pass(const PolicyArgs& a, const pixel::Image8& im, const Target& dst, const int64_t* kinds,
              const double* params, const float* matrices, const Pass& p, Rows&& rows) {
  const bool channels_last = im.sc == 1 && im.sx == 3 && dst.sc == 1 && dst.sx == 3;
  const int32_t kind = p.lut ? kIdentity : static_cast<int32_t>(kinds[p.first]);
  // A run of only direct point ops (and identities) over contiguous rows: evaluated per byte, in order.
  bool all_direct = p.lut && channels_last;
  for (int64_t i = p.first; i < p.last && all_direct; ++i)
    all_direct = is_direct_kind(static_cast<int32_t>(kinds[i])) || kinds[i] == kIdentity;
  const int64_t direct = all_direct ? p.last - p.first : 0;
  uint8_t lut[768];
  if (p.lut && !direct) fold_tables(im, kinds, params, p, lut);
  const float* matrix = matrices + 6 * p.first;
  if (kind == kAffine && reads_across_rows(matrix)) touch_image(im);
  const uint8_t* table = p.lut && !direct ? lut : nullptr;
  const int64_t* k = kinds + p.first;
  const double* q = params + p.first;
  rows(im.h, [&](int64_t y0, int64_t y1, std::vector<int32_t>& ints) {
    dispatch([&](auto isa) {
      using Isa = decltype(isa);
      if (channels_last)
        pass_rows<Isa>(a, im, dst, ChannelsLast{}, ChannelsLast{}, kind, k, q, matrix, table, direct, y0, y1, ints);
      else
        pass_rows<Isa>(a, im, dst, AnyStrides{im.sc, im.sx}, AnyStrides{dst.sc, dst.sx}, kind, k, q, matrix, table, 0,
                       y0, y1, ints);
    });
  });
}

// All of sample n's steps, pass after pass: the first reads its input, the last writes its output,
// those between go through the two scratch images. No pass (every step the identity): a copy.
template <typename Rows>
void run_sample(const PolicyArgs& a, int64_t n, Scratch& scratch, std::vector<Pass>& passes, Rows&& rows) {
  const int64_t slots = a.slots;
  const int64_t* kinds = a.kinds + n * slots;
  const double* params = a.params + n * slots;
  const float* matrices = a.matrices + 6 * n * slots;
  const pixel::Image8 input = a.input.sample(n);
  const Target output{a.output + n * a.out_stride[0], a.out_stride[1], a.out_stride[2], a.out_stride[3]};
  plan(kinds, slots, passes);
  if (passes.empty()) passes.push_back({0, 0, false});  // kinds[0] is the identity: copies
  pixel::Image8 src = input;
  for (size_t k = 0; k < passes.size(); ++k) {
    Target dst = output;
    if (k + 1 < passes.size()) {
      std::vector<uint8_t>& image = scratch.images[k % 2];
      image.resize(static_cast<size_t>(3 * input.h * input.w));
      dst = Target{image.data(), 1, 3 * input.w, 3};
    }
    run_pass(a, src, dst, kinds, params, matrices, passes[k], rows);
    src = pixel::Image8{dst.data, input.h, input.w, dst.sc, dst.sy, dst.sx};
  }
}

}  // namespace

void policy_apply_cpu(const PolicyArgs& a, int num_threads) {
  const int64_t n = a.input.n, h = a.input.h;
  if (n == 0 || h == 0 || a.input.w == 0) return;
  if (a.slots < 1) throw InvalidArgument("a policy needs at least one op slot");
  if (num_threads <= 1 || n >= 4LL * num_threads) {
    // Enough samples to share out: one task per sample, all its passes, its image in the cache.
    auto sample = [&](size_t i) {
      thread_local Scratch scratch;
      thread_local std::vector<Pass> passes;
      run_sample(a, static_cast<int64_t>(i), scratch, passes,
                 [&](int64_t rows, auto&& fn) { fn(int64_t{0}, rows, scratch.ints); });
    };
    if (num_threads <= 1) {
      for (int64_t i = 0; i < n; ++i) sample(static_cast<size_t>(i));
    } else {
      get_pool(num_threads)->parallel_for(static_cast<size_t>(n), sample);
    }
    return;
  }
  // Few, large samples: one after the other, the rows of each pass shared out on the pool.
  Scratch scratch;
  std::vector<Pass> passes;
  for (int64_t i = 0; i < n; ++i)
    run_sample(a, i, scratch, passes, [&](int64_t rows, auto&& fn) {
      parallel_rows(rows, num_threads, [&](int64_t y0, int64_t y1) {
        thread_local std::vector<int32_t> ints;
        fn(y0, y1, ints);
      });
    });
}

}  // namespace gpupipe
