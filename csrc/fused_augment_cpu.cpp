#include "fused_augment_cpu.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "../cuda/fused_color.cuh"
#include "errors.h"
#include "multiversion.h"
#include "thread_pool.h"

namespace gpupipe {
namespace {


// One output row in three simple loops the compiler vectorises: (1) gather the (mirrored) input
// row into planar float rows, (2) apply the matrix on contiguous floats, (3) convert to the output
// dtype. Each keeps the per-pixel math of fused_color.cuh (apply_matrix's expression order).
template <typename In>
inline void gather_row(const In* __restrict__ row, int64_t w, int64_t sc, int64_t sw, bool hflip,
                       float* __restrict__ r, float* __restrict__ g, float* __restrict__ b) {
  if (sc == 1 && sw == 3) {  // channels-last (the decoder's output)
    for (int64_t x = 0; x < w; ++x) {
      r[x] = static_cast<float>(row[3 * x]);
      g[x] = static_cast<float>(row[3 * x + 1]);
      b[x] = static_cast<float>(row[3 * x + 2]);
    }
  } else if (sw == 1) {  // planar rows
    for (int64_t x = 0; x < w; ++x) {
      r[x] = static_cast<float>(row[x]);
      g[x] = static_cast<float>(row[sc + x]);
      b[x] = static_cast<float>(row[2 * sc + x]);
    }
  } else {
    for (int64_t x = 0; x < w; ++x) {
      r[x] = static_cast<float>(row[x * sw]);
      g[x] = static_cast<float>(row[x * sw + sc]);
      b[x] = static_cast<float>(row[x * sw + 2 * sc]);
    }
  }
  if (hflip) {
    std::reverse(r, r + w);
    std::reverse(g, g + w);
    std::reverse(b, b + w);
  }
}

inline void matrix_row(const float* m, int64_t w, const float* __restrict__ r, const float* __restrict__ g,
                       const float* __restrict__ b, float* __restrict__ o0, float* __restrict__ o1,
                       float* __restrict__ o2) {
  const float m0 = m[0], m1 = m[1], m2 = m[2], m3 = m[3], m4 = m[4], m5 = m[5], m6 = m[6], m7 = m[7],
              m8 = m[8], m9 = m[9], m10 = m[10], m11 = m[11];
  for (int64_t x = 0; x < w; ++x) o0[x] = m0 * r[x] + m1 * g[x] + m2 * b[x] + m3;
  for (int64_t x = 0; x < w; ++x) o1[x] = m4 * r[x] + m5 * g[x] + m6 * b[x] + m7;
  for (int64_t x = 0; x < w; ++x) o2[x] = m8 * r[x] + m9 * g[x] + m10 * b[x] + m11;
}

template <typename In>
inline void row_kernel(const FusedArgs& a, int64_t n, int64_t y, std::vector<float>& scratch) {
  const int64_t w = a.w, plane = a.h * a.w;
  scratch.resize(static_cast<size_t>(6 * w));
  float *r = scratch.data(), *g = r + w, *b = g + w;
  const int64_t sy = fused::source_index(y, a.h, a.vflip[n] != 0);
  const In* row = static_cast<const In*>(a.input) + n * a.in_stride[0] + sy * a.in_stride[2];
  gather_row(row, w, a.in_stride[1], a.in_stride[3], a.hflip[n] != 0, r, g, b);
  const float* m = a.matrices + 12 * n;
  const int64_t offset = n * 3 * plane + y * w;
  if (a.out_dtype == fused::kFloat32) {
    float* o = static_cast<float*>(a.output) + offset;
    matrix_row(m, w, r, g, b, o, o + plane, o + 2 * plane);
    return;
  }
  float* t = b + w;  // three float rows, then converted
  matrix_row(m, w, r, g, b, t, t + w, t + 2 * w);
  uint16_t* o = static_cast<uint16_t*>(a.output) + offset;
  for (int c = 0; c < 3; ++c) {
    const float* src = t + c * w;
    uint16_t* dst = o + c * plane;
    if (a.out_dtype == fused::kBFloat16)
      for (int64_t x = 0; x < w; ++x) dst[x] = fused::to_bfloat16_bits(src[x]);
    else
      for (int64_t x = 0; x < w; ++x) dst[x] = fused::to_float16_bits(src[x]);
  }
}

template <typename In>
GPUPIPE_MULTIVERSION void run_rows(const FusedArgs& a, int64_t begin, int64_t end) {
  thread_local std::vector<float> scratch;
  for (int64_t r = begin; r < end; ++r) row_kernel<In>(a, r / a.h, r % a.h, scratch);
}

}  // namespace

template <typename In>
GPUPIPE_MULTIVERSION void sums_of(const FusedArgs& a, int64_t n, double* out) {
  const In* in = static_cast<const In*>(a.input) + n * a.in_stride[0];
  const int64_t sc = a.in_stride[1], sh = a.in_stride[2], sw = a.in_stride[3];
  double total[3] = {0, 0, 0};
  for (int64_t y = 0; y < a.h; ++y) {
    const In* row = in + y * sh;
    if (sc == 1 && sw == 3) {
      // uint8 rows sum exactly in 64-bit integers (floats in float accumulators), per channel
      typename std::conditional<std::is_same<In, uint8_t>::value, uint64_t, double>::type acc[3] = {0, 0, 0};
      for (int64_t x = 0; x < a.w; ++x) {
        acc[0] += row[3 * x];
        acc[1] += row[3 * x + 1];
        acc[2] += row[3 * x + 2];
      }
      for (int c = 0; c < 3; ++c) total[c] += static_cast<double>(acc[c]);
    } else {
      for (int c = 0; c < 3; ++c) {
        typename std::conditional<std::is_same<In, uint8_t>::value, uint64_t, double>::type acc = 0;
        const In* p = row + c * sc;
        for (int64_t x = 0; x < a.w; ++x) acc += p[x * sw];
        total[c] += static_cast<double>(acc);
      }
    }
  }
  for (int c = 0; c < 3; ++c) out[3 * n + c] = total[c];
}

void channel_sums_cpu(const FusedArgs& a, double* out, int num_threads) {
  auto one = [&](size_t n) {
    if (a.input_is_uint8) sums_of<uint8_t>(a, static_cast<int64_t>(n), out);
    else sums_of<float>(a, static_cast<int64_t>(n), out);
  };
  if (num_threads <= 1 || a.n < 2) {
    for (int64_t n = 0; n < a.n; ++n) one(static_cast<size_t>(n));
    return;
  }
  get_pool(num_threads)->parallel_for(static_cast<size_t>(a.n), one);
}

void fused_color_affine_cpu(const FusedArgs& a, int num_threads) {
  if (a.out_dtype < 0 || a.out_dtype > 2) throw InvalidArgument("unknown output dtype");
  const int64_t rows = a.n * a.h;
  if (rows == 0 || a.w == 0) return;
  auto run = [&](int64_t begin, int64_t end) {
    if (a.input_is_uint8) run_rows<uint8_t>(a, begin, end);
    else run_rows<float>(a, begin, end);
  };
  if (num_threads <= 1 || rows < 64) {
    run(0, rows);
    return;
  }
  const int64_t chunks = std::min<int64_t>(rows, 8LL * num_threads);
  get_pool(num_threads)->parallel_for(static_cast<size_t>(chunks), [&](size_t c) {
    run(rows * static_cast<int64_t>(c) / chunks, rows * static_cast<int64_t>(c + 1) / chunks);
  });
}

}  // namespace gpupipe
