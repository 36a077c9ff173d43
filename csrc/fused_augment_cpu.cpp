#include "fused_augment_cpu.h"

#include <algorithm>

#include "../cuda/fused_color.cuh"
#include "errors.h"
#include "thread_pool.h"

namespace gpupipe {
namespace {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GPUPIPE_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define GPUPIPE_MULTIVERSION
#endif

template <typename In, typename Out, typename Store>
inline void row_kernel(const FusedArgs& a, int64_t n, int64_t y, Store store) {
  const In* in = static_cast<const In*>(a.input);
  const float* m = a.matrices + 12 * n;
  const int64_t sy = fused::source_index(y, a.h, a.vflip[n] != 0);
  const bool hflip = a.hflip[n] != 0;
  const int64_t sc = a.in_stride[1], sw = a.in_stride[3];
  const In* row = in + n * a.in_stride[0] + sy * a.in_stride[2];
  const int64_t plane = a.h * a.w;
  Out* out = static_cast<Out*>(a.output) + n * 3 * plane + y * a.w;
  // Read from the far end when flipped, so the loop body stays branch-free.
  const In* px = hflip ? row + (a.w - 1) * sw : row;
  const int64_t step = hflip ? -sw : sw;
  for (int64_t x = 0; x < a.w; ++x, px += step) {
    float o[3];
    fused::apply_matrix(m, static_cast<float>(px[0]), static_cast<float>(px[sc]),
                        static_cast<float>(px[2 * sc]), o);
    out[x] = store(o[0]);
    out[plane + x] = store(o[1]);
    out[2 * plane + x] = store(o[2]);
  }
}

struct StoreF32 {
  float operator()(float v) const { return v; }
};
struct StoreBF16 {
  uint16_t operator()(float v) const { return fused::to_bfloat16_bits(v); }
};
struct StoreF16 {
  uint16_t operator()(float v) const { return fused::to_float16_bits(v); }
};

template <typename In>
GPUPIPE_MULTIVERSION void run_rows(const FusedArgs& a, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const int64_t n = r / a.h, y = r % a.h;
    switch (a.out_dtype) {
      case fused::kFloat32: row_kernel<In, float>(a, n, y, StoreF32{}); break;
      case fused::kBFloat16: row_kernel<In, uint16_t>(a, n, y, StoreBF16{}); break;
      default: row_kernel<In, uint16_t>(a, n, y, StoreF16{}); break;
    }
  }
}

}  // namespace

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
