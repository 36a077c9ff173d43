#include "augment_cpu.h"

#include <algorithm>

#include "elem_type.h"
#include "errors.h"
#include "multiversion.h"
#include "parallel_rows.h"

namespace gpupipe {

namespace {

template <typename Out>
GPUPIPE_MULTIVERSION void warp_rows(const WarpArgs& a, int64_t begin, int64_t end) {
  const int64_t h = a.input.h, w = a.input.w;
  const int64_t* os = a.out_stride;
  for (int64_t row = begin; row < end; ++row) {
    const int64_t i = row / h, y = row % h;
    const pixel::Image8 im = a.input.sample(i);
    const float* m = a.matrices + 6 * i;
    Out* out = static_cast<Out*>(a.output) + i * os[0] + y * os[2];
    for (int64_t x = 0; x < w; ++x) {
      float sx, sy, v[3];
      pixel::affine_source(m, static_cast<float>(x), static_cast<float>(y), &sx, &sy);
      pixel::sample(im, a.interpolation, a.fill, sx, sy, v);
      for (int c = 0; c < 3; ++c) {
        if constexpr (sizeof(Out) == 1) out[c * os[1] + x * os[3]] = pixel::to_uint8(v[c]);
        else out[c * os[1] + x * os[3]] = v[c];
      }
    }
  }
}

}  // namespace

void warp_affine_cpu(const WarpArgs& a, int num_threads) {
  if (a.out_type != kUInt8 && a.out_type != kFloat32) throw InvalidArgument("warp_affine: unknown output type");
  parallel_rows(a.input.n * a.input.h, num_threads, [&](int64_t begin, int64_t end) {
    if (a.out_type == kUInt8) warp_rows<uint8_t>(a, begin, end);
    else warp_rows<float>(a, begin, end);
  });
}

}  // namespace gpupipe
