#include "policy_cpu.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "errors.h"
#include "multiversion.h"
#include "parallel_rows.h"
#include "thread_pool.h"

namespace gpupipe {
namespace {

using namespace policy;

// Rows are processed planar: gathered from any layout into three contiguous uint8 rows, worked on
// in simple loops the compiler vectorises, and scattered back.
inline void load_row(const uint8_t* __restrict__ row, int64_t w, int64_t sc, int64_t sw, uint8_t* __restrict__ r,
                     uint8_t* __restrict__ g, uint8_t* __restrict__ b) {
  if (sc == 1 && sw == 3) {  // channels-last (the decoder's output)
    for (int64_t x = 0; x < w; ++x) {
      r[x] = row[3 * x];
      g[x] = row[3 * x + 1];
      b[x] = row[3 * x + 2];
    }
  } else if (sw == 1) {
    std::memcpy(r, row, static_cast<size_t>(w));
    std::memcpy(g, row + sc, static_cast<size_t>(w));
    std::memcpy(b, row + 2 * sc, static_cast<size_t>(w));
  } else {
    for (int64_t x = 0; x < w; ++x) {
      r[x] = row[x * sw];
      g[x] = row[x * sw + sc];
      b[x] = row[x * sw + 2 * sc];
    }
  }
}

inline void store_row(uint8_t* __restrict__ row, int64_t w, int64_t sc, int64_t sw, const uint8_t* __restrict__ r,
                      const uint8_t* __restrict__ g, const uint8_t* __restrict__ b) {
  if (sc == 1 && sw == 3) {
    for (int64_t x = 0; x < w; ++x) {
      row[3 * x] = r[x];
      row[3 * x + 1] = g[x];
      row[3 * x + 2] = b[x];
    }
  } else if (sw == 1) {
    std::memcpy(row, r, static_cast<size_t>(w));
    std::memcpy(row + sc, g, static_cast<size_t>(w));
    std::memcpy(row + 2 * sc, b, static_cast<size_t>(w));
  } else {
    for (int64_t x = 0; x < w; ++x) {
      row[x * sw] = r[x];
      row[x * sw + sc] = g[x];
      row[x * sw + 2 * sc] = b[x];
    }
  }
}

inline const uint8_t* input_row(const PolicyArgs& a, int64_t n, int64_t y) {
  return a.input.data + n * a.input.stride[0] + y * a.input.stride[2];
}

// --- pass 1: per-sample statistics and lookup tables ---------------------------------------------

GPUPIPE_MULTIVERSION void gray_floor_row(const uint8_t* __restrict__ r, const uint8_t* __restrict__ g,
                                         const uint8_t* __restrict__ b, int64_t w, float* __restrict__ gray) {
  for (int64_t x = 0; x < w; ++x)
    gray[x] = gray_floor(static_cast<float>(r[x]), static_cast<float>(g[x]), static_cast<float>(b[x]));
}

void sample_table(const PolicyArgs& a, int64_t n, uint8_t* lut, std::vector<uint8_t>& scratch,
                  std::vector<float>& gray) {
  const int32_t kind = static_cast<int32_t>(a.kinds[n]);
  if (!is_lut_kind(kind)) return;
  Stats s;
  s.pixels = a.input.h * a.input.w;
  uint32_t hist[3 * 256];
  if (needs_histogram(kind) || needs_gray_sum(kind)) {
    const int64_t w = a.input.w;
    scratch.resize(static_cast<size_t>(3 * w));
    gray.resize(static_cast<size_t>(w));
    uint8_t *r = scratch.data(), *g = r + w, *b = g + w;
    std::memset(hist, 0, sizeof(hist));
    int64_t gray_sum = 0;
    for (int64_t y = 0; y < a.input.h; ++y) {
      load_row(input_row(a, n, y), w, a.input.stride[1], a.input.stride[3], r, g, b);
      if (needs_histogram(kind)) {
        for (int64_t x = 0; x < w; ++x) {
          ++hist[r[x]];
          ++hist[256 + g[x]];
          ++hist[512 + b[x]];
        }
      } else {
        gray_floor_row(r, g, b, w, gray.data());
        int64_t row_sum = 0;  // gray levels are integers 0..255: the sum is exact
        for (int64_t x = 0; x < w; ++x) row_sum += static_cast<int64_t>(gray[x]);
        gray_sum += row_sum;
      }
    }
    s.hist = hist;
    s.gray_sum = gray_sum;
  }
  build_lut(kind, a.params[n], s, lut);
}

// --- pass 2: output rows ---------------------------------------------------------------------------

GPUPIPE_MULTIVERSION void lut_row(const uint8_t* __restrict__ lut, int64_t w, uint8_t* __restrict__ r,
                                  uint8_t* __restrict__ g, uint8_t* __restrict__ b) {
  for (int64_t x = 0; x < w; ++x) r[x] = lut[r[x]];
  for (int64_t x = 0; x < w; ++x) g[x] = lut[256 + g[x]];
  for (int64_t x = 0; x < w; ++x) b[x] = lut[512 + b[x]];
}

// adjust_saturation: blend each channel with the pixel's floored gray level.
GPUPIPE_MULTIVERSION void color_row(const Blend& bl, int64_t w, float* __restrict__ gray, uint8_t* __restrict__ r,
                                    uint8_t* __restrict__ g, uint8_t* __restrict__ b) {
  gray_floor_row(r, g, b, w, gray);
  for (int64_t x = 0; x < w; ++x) r[x] = blend_pixel(bl, static_cast<float>(r[x]), gray[x]);
  for (int64_t x = 0; x < w; ++x) g[x] = blend_pixel(bl, static_cast<float>(g[x]), gray[x]);
  for (int64_t x = 0; x < w; ++x) b[x] = blend_pixel(bl, static_cast<float>(b[x]), gray[x]);
}

// adjust_sharpness on one channel of an interior row: above, mid, below are its three input rows.
GPUPIPE_MULTIVERSION void sharpen_row(float alpha, int64_t w, const uint8_t* __restrict__ above,
                                      const uint8_t* __restrict__ mid, const uint8_t* __restrict__ below,
                                      int32_t* __restrict__ cols, uint8_t* __restrict__ out) {
  for (int64_t x = 0; x < w; ++x) cols[x] = static_cast<int32_t>(above[x]) + mid[x] + below[x];
  out[0] = mid[0];
  for (int64_t x = 1; x + 1 < w; ++x) out[x] = sharpen_pixel(cols[x - 1] + cols[x] + cols[x + 1], mid[x], alpha);
  out[w - 1] = mid[w - 1];
}

struct RowScratch {
  std::vector<uint8_t> bytes;
  std::vector<float> floats;
  std::vector<int32_t> ints;
};

// The geometric ops: each output pixel samples the input through the sample's inverse affine map
// (augment_pixel.h, the warp shared with warp_affine and the CUDA kernels).
GPUPIPE_MULTIVERSION void affine_row(const PolicyArgs& a, int64_t n, int64_t y, uint8_t* __restrict__ r,
                                     uint8_t* __restrict__ g, uint8_t* __restrict__ b) {
  const pixel::Image8 im = a.input.sample(n);
  const float* m = a.matrices + 6 * n;
  for (int64_t x = 0; x < a.input.w; ++x) {
    float sx, sy, v[3];
    pixel::affine_source(m, static_cast<float>(x), static_cast<float>(y), &sx, &sy);
    pixel::sample(im, a.interpolation, a.fill, sx, sy, v);
    r[x] = pixel::to_uint8(v[0]);
    g[x] = pixel::to_uint8(v[1]);
    b[x] = pixel::to_uint8(v[2]);
  }
}

void output_row(const PolicyArgs& a, const uint8_t* luts, int64_t n, int64_t y, RowScratch& s) {
  const int64_t w = a.input.w;
  const int32_t kind = static_cast<int32_t>(a.kinds[n]);
  s.bytes.resize(static_cast<size_t>(12 * w));
  uint8_t *r = s.bytes.data(), *g = r + w, *b = g + w;
  const int64_t isc = a.input.stride[1], isw = a.input.stride[3];
  if (kind == kAffine) {
    affine_row(a, n, y, r, g, b);
  } else if (kind == kSharpness && y > 0 && y + 1 < a.input.h && w > 2) {
    uint8_t* rows = b + w;  // above r, g, b, then below r, g, b
    load_row(input_row(a, n, y - 1), w, isc, isw, rows, rows + w, rows + 2 * w);
    load_row(input_row(a, n, y), w, isc, isw, r, g, b);
    load_row(input_row(a, n, y + 1), w, isc, isw, rows + 3 * w, rows + 4 * w, rows + 5 * w);
    s.ints.resize(static_cast<size_t>(w));
    s.floats.resize(static_cast<size_t>(w));
    const float alpha = static_cast<float>(1.0 - a.params[n]);
    uint8_t* out[3] = {r, g, b};
    uint8_t* tmp = reinterpret_cast<uint8_t*>(s.floats.data());  // w bytes of room
    for (int c = 0; c < 3; ++c) {
      sharpen_row(alpha, w, rows + c * w, out[c], rows + (3 + c) * w, s.ints.data(), tmp);
      std::memcpy(out[c], tmp, static_cast<size_t>(w));
    }
  } else {
    load_row(input_row(a, n, y), w, isc, isw, r, g, b);
    if (is_lut_kind(kind) && kind != kIdentity) {
      lut_row(luts + 768 * n, w, r, g, b);
    } else if (kind == kColor) {
      s.floats.resize(static_cast<size_t>(w));
      color_row(make_blend(a.params[n]), w, s.floats.data(), r, g, b);
    }
    // kIdentity, and kSharpness on border rows: the input row as is
  }
  store_row(a.output_row(n, y), w, a.out_stride[1], a.out_stride[3], r, g, b);
}

}  // namespace

void policy_apply_cpu(const PolicyArgs& a, int num_threads) {
  const int64_t n = a.input.n, h = a.input.h;
  if (n == 0 || h == 0 || a.input.w == 0) return;
  std::vector<uint8_t> luts(static_cast<size_t>(n) * 768);
  auto table = [&](size_t i) {
    thread_local std::vector<uint8_t> scratch;
    thread_local std::vector<float> gray;
    sample_table(a, static_cast<int64_t>(i), luts.data() + 768 * i, scratch, gray);
  };
  if (num_threads > 1 && n > 1) get_pool(num_threads)->parallel_for(static_cast<size_t>(n), table);
  else for (int64_t i = 0; i < n; ++i) table(static_cast<size_t>(i));

  parallel_rows(n * h, num_threads, [&](int64_t begin, int64_t end) {
    thread_local RowScratch scratch;
    for (int64_t r = begin; r < end; ++r) output_row(a, luts.data(), r / h, r % h, scratch);
  });
}

}  // namespace gpupipe
