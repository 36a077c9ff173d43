// Host build of the augmentation kernels. Work is done a row at a time in short loops the compiler
// vectorises at the CPU's width (a task's rows run under dispatch(), multiversion.h), each calling
// the per-pixel functions of augment_pixel.h / augment_kernels.h (the ones the CUDA kernels call
// per pixel), so the results are the device's bit for bit:
//   sample   the warped input row (axis-aligned maps: direct reads; rotations: the 4 neighbours of
//            each interior pixel gathered as two 8-byte loads, weights and blend vectorised; border
//            pixels through pixel::sample),
//   color    each op of the sample's order over the row, then grayscale and normalise,
//   store    float32 / bfloat16 / float16, planar (NCHW) or interleaved (channels-last) rows.
// With enough samples for the threads, a task takes whole samples and reads each input once (pass 1
// keeps the sampled rows in the sample's plane, in cache, while summing contrast's mean; pass 2
// finishes from there): one parallel_for. Otherwise rows are split, one parallel_for per pass,
// and pass 2 samples again. Per-sample parameters are read once per row.
#include "augment/augment_cpu.h"

#include <string.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

#include "common/errors.h"
#include "common/multiversion.h"
#include "common/parallel_rows.h"

namespace gpupipe {
namespace {

// Row buffers of one thread.
struct Row {
  std::vector<float> floats;
  std::vector<uint32_t> gathered;  // 2 per pixel: two rows' neighbour pairs, or one pixel
  std::vector<int32_t> offsets;    // byte offsets of the gathered neighbours, or kOutside / kPartial
  std::vector<int32_t> partials;   // the pixels with some neighbours outside the image
  float *r = nullptr, *g = nullptr, *b = nullptr, *sx = nullptr, *sy = nullptr, *spare = nullptr;
  uint32_t *top = nullptr, *bottom = nullptr;
  int32_t* offset = nullptr;
  int32_t* partial = nullptr;

  // Rows are sampled into and colored in r, g, b: the row's own buffers, or rows of a sample's
  // plane (write_to) that the second pass reads back.
  void write_to(float* r_row, float* g_row, float* b_row) {
    r = r_row;
    g = g_row;
    b = b_row;
  }

  void reserve(int64_t w) {
    floats.resize(static_cast<size_t>(6 * w));
    gathered.resize(static_cast<size_t>(4 * w));
    offsets.resize(static_cast<size_t>(w));
    offset = offsets.data();
    partials.resize(static_cast<size_t>(w));
    partial = partials.data();
    r = floats.data();
    g = r + w;
    b = g + w;
    sx = b + w;
    sy = sx + w;
    spare = sy + w;
    top = gathered.data();
    bottom = top + 2 * w;
  }
};

Row& thread_row(int64_t w) {
  thread_local Row row;
  row.reserve(w);
  return row;
}

bool is_integer(float v) { return v == floorf(v) && fabsf(v) < 16777216.0f; }

// An axis-aligned map with integer offsets (identity, flips, integer translations): every sample
// is an exact pixel read (nearest: rint of an integer; bilinear: weights 1, 0, 0, 0).
bool axis_aligned(const float* m) {
  return m[1] == 0.0f && m[3] == 0.0f && (m[0] == 1.0f || m[0] == -1.0f) && (m[4] == 1.0f || m[4] == -1.0f) &&
         is_integer(m[2]) && is_integer(m[5]);
}

bool channels_last(const pixel::Image8& im) { return im.sc == 1 && im.sx == 3; }

// --- sampling a row (0..255 scale) ---------------------------------------------------------------

void fill_span(Row& row, int64_t begin, int64_t end, const pixel::Fill& fill) {
  for (int c = 0; c < 3; ++c) {
    float* dst = c == 0 ? row.r : c == 1 ? row.g : row.b;
    std::fill(dst + begin, dst + end, fill.enabled ? fill.value[c] : 0.0f);
  }
}

inline void sample_axis_aligned(const pixel::Image8& im, const float* m, int interpolation,
                                const pixel::Fill& fill, int64_t y, int64_t w, Row& row) {
  float sx0, sy;  // sx0 unused: the row's x range follows from m
  pixel::affine_source(m, 0.0f, static_cast<float>(y), &sx0, &sy);
  if (!(sy >= 0.0f && sy <= static_cast<float>(im.h - 1))) return fill_span(row, 0, w, fill);
  const int64_t dir = m[0] > 0.0f ? 1 : -1, off = static_cast<int64_t>(m[2]);
  // x with 0 <= dir * x + off <= W - 1
  const int64_t lo = dir > 0 ? -off : off - (im.w - 1), hi = dir > 0 ? im.w - 1 - off : off;
  const int64_t begin = std::min(std::max<int64_t>(0, lo), w), end = std::max(begin, std::min(w, hi + 1));
  fill_span(row, 0, begin, fill);
  fill_span(row, end, w, fill);
  if (begin == end) return;
  const uint8_t* src = im.data + static_cast<int64_t>(sy) * im.sy + (dir * begin + off) * im.sx;
  const int64_t step = dir * im.sx, sc = im.sc, n = end - begin;
  float* __restrict__ r = row.r + begin;
  float* __restrict__ g = row.g + begin;
  float* __restrict__ b = row.b + begin;
  if (channels_last(im) && dir > 0) {
    for (int64_t k = 0; k < n; ++k) {
      r[k] = src[3 * k];
      g[k] = src[3 * k + 1];
      b[k] = src[3 * k + 2];
    }
  } else if (channels_last(im)) {  // mirrored: deinterleave forward, then reverse (both vectorise)
    const uint8_t* lowest = src - 3 * (n - 1);
    float* __restrict__ tr = row.sx;
    float* __restrict__ tg = row.sy;
    float* __restrict__ tb = row.spare;
    for (int64_t j = 0; j < n; ++j) {
      tr[j] = lowest[3 * j];
      tg[j] = lowest[3 * j + 1];
      tb[j] = lowest[3 * j + 2];
    }
    std::reverse_copy(tr, tr + n, r);
    std::reverse_copy(tg, tg + n, g);
    std::reverse_copy(tb, tb + n, b);
  } else {
    for (int64_t k = 0; k < n; ++k) {
      r[k] = src[k * step];
      g[k] = src[k * step + sc];
      b[k] = src[k * step + 2 * sc];
    }
  }
  if (interpolation == pixel::kBilinear && fill.enabled) {  // (v - fill) * mask + fill, mask = 1
    const float f0 = fill.value[0], f1 = fill.value[1], f2 = fill.value[2];
    for (int64_t k = 0; k < n; ++k) {
      r[k] = pixel::add(pixel::sub(r[k], f0), f0);
      g[k] = pixel::add(pixel::sub(g[k], f1), f1);
      b[k] = pixel::add(pixel::sub(b[k], f2), f2);
    }
  }
}

// pixel::sample's bilinear arithmetic for pixels whose 4 neighbours are inside the image, from the
// gathered pairs (bytes r00 g00 b00 r01 | g01 b01 . . of rows y0 and y0 + 1).
inline void blend_gathered(const float* __restrict__ sx, const float* __restrict__ sy,
                           const uint32_t* __restrict__ top, const uint32_t* __restrict__ bottom,
                           int64_t w, float* __restrict__ r, float* __restrict__ g, float* __restrict__ b) {
  auto byte = [](uint32_t v, int k) { return static_cast<float>(static_cast<int32_t>((v >> (8 * k)) & 255u)); };
  for (int64_t x = 0; x < w; ++x) {
    const float x0 = pixel::floor(sx[x]), y0 = pixel::floor(sy[x]);
    const float wx1 = pixel::sub(sx[x], x0), wy1 = pixel::sub(sy[x], y0);
    const float wx0 = pixel::sub(1.0f, wx1), wy0 = pixel::sub(1.0f, wy1);
    const float w00 = pixel::mul(wy0, wx0), w01 = pixel::mul(wy0, wx1);
    const float w10 = pixel::mul(wy1, wx0), w11 = pixel::mul(wy1, wx1);
    const uint32_t t0 = top[2 * x], t1 = top[2 * x + 1], b0 = bottom[2 * x], b1 = bottom[2 * x + 1];
    r[x] = pixel::add(pixel::add(pixel::add(pixel::mul(w00, byte(t0, 0)), pixel::mul(w01, byte(t0, 3))),
                                 pixel::mul(w10, byte(b0, 0))), pixel::mul(w11, byte(b0, 3)));
    g[x] = pixel::add(pixel::add(pixel::add(pixel::mul(w00, byte(t0, 1)), pixel::mul(w01, byte(t1, 0))),
                                 pixel::mul(w10, byte(b0, 1))), pixel::mul(w11, byte(b1, 0)));
    b[x] = pixel::add(pixel::add(pixel::add(pixel::mul(w00, byte(t0, 2)), pixel::mul(w01, byte(t1, 1))),
                                 pixel::mul(w10, byte(b0, 2))), pixel::mul(w11, byte(b1, 1)));
  }
}

// The fill blend of those pixels: (v - fill) * mask + fill, mask the sum of the 4 weights.
inline void fill_gathered(const float* __restrict__ sx, const float* __restrict__ sy, int64_t w,
                          const pixel::Fill& fill, float* __restrict__ r, float* __restrict__ g,
                          float* __restrict__ b) {
  const float f0 = fill.value[0], f1 = fill.value[1], f2 = fill.value[2];
  for (int64_t x = 0; x < w; ++x) {
    const float x0 = pixel::floor(sx[x]), y0 = pixel::floor(sy[x]);
    const float wx1 = pixel::sub(sx[x], x0), wy1 = pixel::sub(sy[x], y0);
    const float wx0 = pixel::sub(1.0f, wx1), wy0 = pixel::sub(1.0f, wy1);
    const float mask = pixel::add(pixel::add(pixel::add(pixel::mul(wy0, wx0), pixel::mul(wy0, wx1)),
                                             pixel::mul(wy1, wx0)), pixel::mul(wy1, wx1));
    r[x] = pixel::add(pixel::mul(pixel::sub(r[x], f0), mask), f0);
    g[x] = pixel::add(pixel::mul(pixel::sub(g[x], f1), mask), f1);
    b[x] = pixel::add(pixel::mul(pixel::sub(b[x], f2), mask), f2);
  }
}

// Where each pixel of a row reads: the byte offset of its neighbours when they are all inside the
// image (nearest: the pixel, a 4-byte read, so not in the last column; bilinear: the pair
// (x0, x0 + 1) of row y0, 8-byte reads of rows y0 and y0 + 1, so x0 <= W - 3 and y0 <= H - 2),
// kOutside when none is (the pixel is the fill), kPartial otherwise (pixel::sample, one by one).
constexpr int32_t kPartial = -1, kOutside = -2;

inline void gather_offsets(const float* __restrict__ sx, const float* __restrict__ sy, int64_t w,
                           const pixel::Image8& im, bool nearest, int32_t* __restrict__ offset) {
  const float last_x = static_cast<float>(im.w - 1), last_y = static_cast<float>(im.h - 1);
  const float read_x = last_x - (nearest ? 1.0f : 2.0f), read_y = last_y - (nearest ? 0.0f : 1.0f);
  const float out_lo = nearest ? 0.0f : -1.0f;  // bilinear: x0 = -1 still reads pixel 0
  const int32_t row_stride = static_cast<int32_t>(im.sy);
  for (int64_t x = 0; x < w; ++x) {
    const float fx = nearest ? pixel::round_even(sx[x]) : pixel::floor(sx[x]);
    const float fy = nearest ? pixel::round_even(sy[x]) : pixel::floor(sy[x]);
    const bool inside = (fx >= 0.0f) & (fx <= read_x) & (fy >= 0.0f) & (fy <= read_y);
    const bool outside = (fx < out_lo) | (fx > last_x) | (fy < out_lo) | (fy > last_y);
    const int32_t ix = static_cast<int32_t>(inside ? fx : 0.0f), iy = static_cast<int32_t>(inside ? fy : 0.0f);
    offset[x] = inside ? iy * row_stride + 3 * ix : (outside ? kOutside : kPartial);
  }
}

// The value of pixels that read nothing from the image: the fill, or 0 (zero padding).
inline void fill_outside(const int32_t* __restrict__ offset, int64_t w, const pixel::Fill& fill,
                         float* __restrict__ r, float* __restrict__ g, float* __restrict__ b) {
  const float f0 = fill.enabled ? fill.value[0] : 0.0f, f1 = fill.enabled ? fill.value[1] : 0.0f,
              f2 = fill.enabled ? fill.value[2] : 0.0f;
  for (int64_t x = 0; x < w; ++x) {
    const bool out = offset[x] == kOutside;
    r[x] = out ? f0 : r[x];
    g[x] = out ? f1 : g[x];
    b[x] = out ? f2 : b[x];
  }
}

// Any map, channels-last input (a sample below 1 GB): the neighbours of interior pixels gathered
// with unaligned loads (nearest: 4 bytes, the pixel; bilinear: 8 bytes, the pixel pair (x0, x0 + 1)
// of rows y0 and y0 + 1), then unpacked and blended in vectorised loops; pixels outside the image
// are the fill; the few with some neighbours outside go through pixel::sample.
inline void sample_gathered(const pixel::Image8& im, const float* m, int interpolation,
                            const pixel::Fill& fill, int64_t y, int64_t w, Row& row) {
  float* __restrict__ sx = row.sx;
  float* __restrict__ sy = row.sy;
  const float fy = static_cast<float>(y);
  const float mm[6] = {m[0], m[1], m[2], m[3], m[4], m[5]};  // locals: no aliasing with sx, sy
  // (x < 2^24 as int32 -> float: exact, and vectorisable, unlike int64 -> float on AVX2)
  for (int64_t x = 0; x < w; ++x)
    pixel::affine_source(mm, static_cast<float>(static_cast<int32_t>(x)), fy, &sx[x], &sy[x]);
  uint32_t* __restrict__ top = row.top;
  uint32_t* __restrict__ bottom = row.bottom;
  float* __restrict__ r = row.r;
  float* __restrict__ g = row.g;
  float* __restrict__ b = row.b;
  const bool nearest = interpolation == pixel::kNearest;
  gather_offsets(sx, sy, w, im, nearest, row.offset);
  const int32_t* __restrict__ offset = row.offset;
  int32_t* partial = row.partial;  // the pixels pixel::sample takes, collected while gathering
  int64_t partials = 0;
  if (nearest) {  // (separate loops: a constant memcpy size is one load and one store)
    for (int64_t x = 0; x < w; ++x) {
      if (offset[x] >= 0) memcpy(&top[2 * x], im.data + offset[x], 4);
      else if (offset[x] == kPartial) partial[partials++] = static_cast<int32_t>(x);
    }
    for (int64_t x = 0; x < w; ++x) {
      const uint32_t v = top[2 * x];
      r[x] = static_cast<float>(static_cast<int32_t>(v & 255u));
      g[x] = static_cast<float>(static_cast<int32_t>((v >> 8) & 255u));
      b[x] = static_cast<float>(static_cast<int32_t>((v >> 16) & 255u));
    }
  } else {
    const int64_t below = im.sy;
    for (int64_t x = 0; x < w; ++x) {
      if (offset[x] >= 0) {
        memcpy(&top[2 * x], im.data + offset[x], 8);
        memcpy(&bottom[2 * x], im.data + offset[x] + below, 8);
      } else if (offset[x] == kPartial) {
        partial[partials++] = static_cast<int32_t>(x);
      }
    }
    blend_gathered(sx, sy, top, bottom, w, r, g, b);
    if (fill.enabled) fill_gathered(sx, sy, w, fill, r, g, b);
  }
  fill_outside(offset, w, fill, r, g, b);
  for (int64_t k = 0; k < partials; ++k) {
    const int64_t x = partial[k];
    float v[3];
    pixel::sample(im, interpolation, fill, sx[x], sy[x], v);
    r[x] = v[0];
    g[x] = v[1];
    b[x] = v[2];
  }
}

// Any map, any strides: pixel by pixel.
void sample_generic(const pixel::Image8& im, const float* m, int interpolation, const pixel::Fill& fill,
                    int64_t y, int64_t w, Row& row) {
  for (int64_t x = 0; x < w; ++x) {
    float sx, sy, v[3];
    pixel::affine_source(m, static_cast<float>(x), static_cast<float>(y), &sx, &sy);
    pixel::sample(im, interpolation, fill, sx, sy, v);
    row.r[x] = v[0];
    row.g[x] = v[1];
    row.b[x] = v[2];
  }
}

// Output row y of a sample's warped image into row.r/g/b, on the 0..255 scale.
void sample_row(const pixel::Image8& im, const float* m, int interpolation, const pixel::Fill& fill, int64_t y,
                int64_t w, Row& row) {
  if (axis_aligned(m)) sample_axis_aligned(im, m, interpolation, fill, y, w, row);
  else if (channels_last(im) && im.w >= 3 && im.h * im.sy < (int64_t{1} << 30))
    sample_gathered(im, m, interpolation, fill, y, w, row);
  else sample_generic(im, m, interpolation, fill, y, w, row);
}

// --- color over a row ([0, 1] scale) -----------------------------------------------------------

inline void scale_row(float* __restrict__ r, float* __restrict__ g, float* __restrict__ b, int64_t w) {
  for (int64_t x = 0; x < w; ++x) {
    r[x] = pixel::mul(r[x], pixel::kInv255);
    g[x] = pixel::mul(g[x], pixel::kInv255);
    b[x] = pixel::mul(b[x], pixel::kInv255);
  }
}

template <int Op>
inline void op_row(float* __restrict__ r, float* __restrict__ g, float* __restrict__ b, int64_t w,
                   float factor, float contrast_term) {
  for (int64_t x = 0; x < w; ++x) pixel::color_op(Op, &r[x], &g[x], &b[x], factor, contrast_term);
}

void color_op_row(int op, Row& row, int64_t w, float factor, float contrast_term) {
  switch (op) {
    case pixel::kBrightness: return op_row<pixel::kBrightness>(row.r, row.g, row.b, w, factor, contrast_term);
    case pixel::kContrast: return op_row<pixel::kContrast>(row.r, row.g, row.b, w, factor, contrast_term);
    case pixel::kSaturation: return op_row<pixel::kSaturation>(row.r, row.g, row.b, w, factor, contrast_term);
    default: return op_row<pixel::kHue>(row.r, row.g, row.b, w, factor, contrast_term);
  }
}

// The sum of mean_fixed(luma) over a row (pass 1's reduction).
inline int64_t luma_sum(const float* __restrict__ r, const float* __restrict__ g,
                                       const float* __restrict__ b, int64_t w, bool linear) {
  int64_t sum = 0;
  if (linear) {
    for (int64_t x = 0; x < w; ++x) sum += pixel::mean_fixed(pixel::mul(linear_luma(r[x], g[x], b[x]), pixel::kInv255));
  } else {
    for (int64_t x = 0; x < w; ++x) sum += pixel::mean_fixed(pixel::luma(r[x], g[x], b[x]));
  }
  return sum;
}

inline void linear_row(float* __restrict__ r, float* __restrict__ g, float* __restrict__ b, int64_t w,
                                      const float* A, MeanTerms terms) {
  for (int64_t x = 0; x < w; ++x) {
    float v[3];
    linear_color(A, terms, r[x], g[x], b[x], v);
    r[x] = v[0];
    g[x] = v[1];
    b[x] = v[2];
  }
}

inline void gray_normalize_row(float* __restrict__ r, float* __restrict__ g, float* __restrict__ b,
                               int64_t w, bool gray, const float* mean, const float* inv_std) {
  if (gray)
    for (int64_t x = 0; x < w; ++x) r[x] = g[x] = b[x] = pixel::luma(r[x], g[x], b[x]);
  const float m0 = mean[0], m1 = mean[1], m2 = mean[2];
  const float s0 = inv_std[0], s1 = inv_std[1], s2 = inv_std[2];
  for (int64_t x = 0; x < w; ++x) {
    r[x] = pixel::normalize(r[x], m0, s0);
    g[x] = pixel::normalize(g[x], m1, s1);
    b[x] = pixel::normalize(b[x], m2, s2);
  }
}

// The program's ops [begin, end), over the row.
void ops_row(const ColorProgram& prog, int begin, int end, float contrast_term, Row& row, int64_t w) {
  for (int k = begin; k < end; ++k) color_op_row(prog.op[k], row, w, prog.factor[k], contrast_term);
}

// chain_before_mean_px and chain_after_mean_px (augment_kernels.h) by rows: up to what pass 1
// averages (the sampled row scaled to [0, 1] and the ops before contrast; linear: the raw
// samples) ...
void chain_before_mean(const AugmentArgs& a, const ColorProgram& prog, Row& row, int64_t w) {
  if (a.color == kColorLinear) return;
  scale_row(row.r, row.g, row.b, w);
  ops_row(prog, 0, prog.before_mean, 0.0f, row, w);
}

// ... and the rest, to the output values: contrast and the ops after it, grayscale, normalise.
void chain_after_mean(const AugmentArgs& a, const float* P, const ColorProgram& prog, const MeanTerms& terms,
                      Row& row, int64_t w) {
  if (a.color == kColorLinear) return linear_row(row.r, row.g, row.b, w, P + param::kLinearA, terms);
  ops_row(prog, prog.before_mean, prog.count, terms.v[0], row, w);
  gray_normalize_row(row.r, row.g, row.b, w, P[param::kGrayscale] != 0.0f, a.mean, a.inv_std);
}

// --- storing a row -----------------------------------------------------------------------------

struct AsFloat {
  float operator()(float v) const { return v; }
};
struct AsBFloat16 {
  uint16_t operator()(float v) const { return pixel::to_bfloat16_bits(v); }
};
struct AsFloat16 {
  uint16_t operator()(float v) const { return pixel::to_float16_bits(v); }
};

template <typename Out, typename Convert>
inline void store_row(const float* __restrict__ r, const float* __restrict__ g,
                      const float* __restrict__ b, int64_t w, Out* __restrict__ out,
                      const int64_t* stride, Convert convert) {
  const int64_t sc = stride[1], sw = stride[3];
  if (sw == 1) {  // planar rows (contiguous NCHW)
    Out* __restrict__ o0 = out;
    Out* __restrict__ o1 = out + sc;
    Out* __restrict__ o2 = out + 2 * sc;
    for (int64_t x = 0; x < w; ++x) o0[x] = convert(r[x]);
    for (int64_t x = 0; x < w; ++x) o1[x] = convert(g[x]);
    for (int64_t x = 0; x < w; ++x) o2[x] = convert(b[x]);
  } else if (sc == 1 && sw == 3) {  // interleaved (channels-last)
    for (int64_t x = 0; x < w; ++x) {
      out[3 * x] = convert(r[x]);
      out[3 * x + 1] = convert(g[x]);
      out[3 * x + 2] = convert(b[x]);
    }
  } else {
    for (int64_t x = 0; x < w; ++x) {
      out[x * sw] = convert(r[x]);
      out[x * sw + sc] = convert(g[x]);
      out[x * sw + 2 * sc] = convert(b[x]);
    }
  }
}

void store(const AugmentArgs& a, const Row& row, int64_t i, int64_t y, int64_t w) {
  const int64_t* os = a.out_stride;
  const int64_t offset = i * os[0] + y * os[2];
  switch (a.out_type) {
    case kFloat32: return store_row(row.r, row.g, row.b, w, static_cast<float*>(a.output) + offset, os, AsFloat{});
    case kBFloat16: return store_row(row.r, row.g, row.b, w, static_cast<uint16_t*>(a.output) + offset, os, AsBFloat16{});
    default: return store_row(row.r, row.g, row.b, w, static_cast<uint16_t*>(a.output) + offset, os, AsFloat16{});
  }
}

template <typename Out>
inline void store_warped(const Row& row, int64_t w, Out* __restrict__ out, const int64_t* stride) {
  const int64_t sc = stride[1], sw = stride[3];
  const float* src[3] = {row.r, row.g, row.b};
  for (int c = 0; c < 3; ++c) {
    const float* __restrict__ v = src[c];
    Out* __restrict__ o = out + c * sc;
    if constexpr (sizeof(Out) == 1) {
      for (int64_t x = 0; x < w; ++x) o[x * sw] = pixel::to_uint8(v[x]);
    } else {
      for (int64_t x = 0; x < w; ++x) o[x * sw] = v[x];
    }
  }
}

}  // namespace

void warp_affine_cpu(const WarpArgs& a, int num_threads) {
  if (a.out_type != kUInt8 && a.out_type != kFloat32) throw InvalidArgument("warp_affine: unknown output type");
  const int64_t h = a.input.h, w = a.input.w;
  parallel_rows(a.input.n * h, num_threads, [&](int64_t begin, int64_t end) {
    Row& row = thread_row(w);
    dispatch([&](auto) {
      for (int64_t rr = begin; rr < end; ++rr) {
        const int64_t i = rr / h, y = rr % h;
        sample_row(a.input.sample(i), a.matrices + 6 * i, a.interpolation, a.fill, y, w, row);
        const int64_t offset = i * a.out_stride[0] + y * a.out_stride[2];
        if (a.out_type == kUInt8) store_warped(row, w, static_cast<uint8_t*>(a.output) + offset, a.out_stride);
        else store_warped(row, w, static_cast<float*>(a.output) + offset, a.out_stride);
      }
    });
  });
}

namespace {

// Pulls a sample into the cache in address order before a rotation reads it along slanted lines,
// which the hardware prefetchers do not follow (channels-last rows; other layouts are left alone).
void prefetch(const pixel::Image8& im) {
  if (!channels_last(im)) return;
  for (int64_t y = 0; y < im.h; ++y) {
    const uint8_t* row = im.data + y * im.sy;
    for (int64_t k = 0; k < 3 * im.w; k += 64) __builtin_prefetch(row + k, 0, 2);
  }
}

// Whole samples per task: pass 1 samples each row once into the sample's plane (one thread's
// scratch, in cache), pass 2 finishes the chain from there. The input is read once.
constexpr int64_t kPlaneBytes = int64_t{16} << 20;

void augment_by_samples(const AugmentArgs& a, int num_threads) {
  const int64_t h = a.input.h, w = a.input.w;
  parallel_rows(a.input.n, num_threads, [&](int64_t begin, int64_t end) {
    Row& row = thread_row(w);
    thread_local std::vector<float> plane;
    dispatch([&](auto) {
      for (int64_t i = begin; i < end; ++i) {
        const float* P = a.params + i * param::kCount;
        const ColorProgram prog = color_program(P);
        const pixel::Image8 im = a.input.sample(i);
        if (!axis_aligned(P + param::kMatrix)) prefetch(im);
        if (!needs_mean(a, i)) {
          const MeanTerms terms = mean_terms(a, P, 0.0f);
          for (int64_t y = 0; y < h; ++y) {
            sample_row(im, P + param::kMatrix, a.interpolation, a.fill, y, w, row);
            chain_before_mean(a, prog, row, w);
            chain_after_mean(a, P, prog, terms, row, w);
            store(a, row, i, y, w);
          }
          continue;
        }
        plane.resize(static_cast<size_t>(3 * h * w));
        int64_t sum = 0;
        for (int64_t y = 0; y < h; ++y) {
          float* r = plane.data() + 3 * y * w;
          row.write_to(r, r + w, r + 2 * w);
          sample_row(im, P + param::kMatrix, a.interpolation, a.fill, y, w, row);
          chain_before_mean(a, prog, row, w);
          sum += luma_sum(row.r, row.g, row.b, w, a.color == kColorLinear);
        }
        const MeanTerms terms = mean_terms(a, P, pixel::mean_from_sum(sum, h * w));
        for (int64_t y = 0; y < h; ++y) {
          float* r = plane.data() + 3 * y * w;
          row.write_to(r, r + w, r + 2 * w);
          chain_after_mean(a, P, prog, terms, row, w);
          store(a, row, i, y, w);
        }
        row.reserve(w);  // back to the row's own buffers
      }
    });
  });
}

// Rows of all samples per task (few samples for the threads, or samples too large to keep):
// pass 1 samples every row for the means, pass 2 samples it again for the output.
void augment_by_rows(const AugmentArgs& a, int num_threads) {
  const int64_t n = a.input.n, h = a.input.h, w = a.input.w;
  std::vector<ColorProgram> programs(static_cast<size_t>(n));  // one per sample, for both passes
  std::vector<int64_t> active;
  for (int64_t i = 0; i < n; ++i) {
    programs[static_cast<size_t>(i)] = color_program(a.params + i * param::kCount);
    if (needs_mean(a, i)) active.push_back(i);
  }
  std::unique_ptr<std::atomic<int64_t>[]> sums(new std::atomic<int64_t>[static_cast<size_t>(n)]);
  for (int64_t i = 0; i < n; ++i) sums[i].store(0, std::memory_order_relaxed);
  parallel_rows(static_cast<int64_t>(active.size()) * h, num_threads, [&](int64_t begin, int64_t end) {
    Row& row = thread_row(w);
    int64_t current = -1, sum = 0;
    dispatch([&](auto) {
      for (int64_t rr = begin; rr < end; ++rr) {
        const int64_t i = active[static_cast<size_t>(rr / h)], y = rr % h;
        if (i != current) {
          if (current >= 0) sums[current].fetch_add(sum, std::memory_order_relaxed);
          current = i;
          sum = 0;
        }
        const float* P = a.params + i * param::kCount;
        sample_row(a.input.sample(i), P + param::kMatrix, a.interpolation, a.fill, y, w, row);
        chain_before_mean(a, programs[static_cast<size_t>(i)], row, w);
        sum += luma_sum(row.r, row.g, row.b, w, a.color == kColorLinear);  // integers: exact in any order
      }
    });
    if (current >= 0) sums[current].fetch_add(sum, std::memory_order_relaxed);
  });
  std::vector<MeanTerms> terms(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float mean = needs_mean(a, i) ? pixel::mean_from_sum(sums[i].load(), h * w) : 0.0f;
    terms[static_cast<size_t>(i)] = mean_terms(a, a.params + i * param::kCount, mean);
  }
  parallel_rows(n * h, num_threads, [&](int64_t begin, int64_t end) {
    Row& row = thread_row(w);
    dispatch([&](auto) {
      for (int64_t rr = begin; rr < end; ++rr) {
        const int64_t i = rr / h, y = rr % h;
        const float* P = a.params + i * param::kCount;
        const ColorProgram& prog = programs[static_cast<size_t>(i)];
        sample_row(a.input.sample(i), P + param::kMatrix, a.interpolation, a.fill, y, w, row);
        chain_before_mean(a, prog, row, w);
        chain_after_mean(a, P, prog, terms[static_cast<size_t>(i)], row, w);
        store(a, row, i, y, w);
      }
    });
  });
}

}  // namespace

void augment_cpu(const AugmentArgs& a, int num_threads) {
  if (a.out_type != kFloat32 && a.out_type != kBFloat16 && a.out_type != kFloat16)
    throw InvalidArgument("augment: unknown output type");
  const int64_t n = a.input.n, h = a.input.h, w = a.input.w;
  if (n == 0 || h == 0 || w == 0) return;
  const bool enough_samples = num_threads <= 1 || n >= 2 * static_cast<int64_t>(num_threads);
  if (enough_samples && 12 * h * w <= kPlaneBytes) augment_by_samples(a, num_threads);
  else augment_by_rows(a, num_threads);
}

}  // namespace gpupipe
