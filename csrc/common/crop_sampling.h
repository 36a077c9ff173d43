// torchvision's RandomResizedCrop.get_params on gpupipe's keyed draws, in native code: the numpy
// definition (tests/test_crops.py keeps it as the reference) operation for operation, so that a
// batch's boxes cost microseconds and no Python per sample. Built with -ffp-contract=off like the
// rest of the core: each product and sum rounds as numpy's do.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/keyed_uniforms.h"

namespace gpupipe {

struct ResizedCropRange {
  double scale0, scale1;          // the area fraction's range
  double log_ratio0, log_ratio1;  // log of the aspect ratio's range (math.log in Python)
  double ratio0, ratio1;          // the aspect ratio's range, for the fallback
};

// out[4 * i ..]: (top, left, height, width) of sample indices[i] in its heights[i] x widths[i]
// image (both >= 1): up to 10 tries of an area fraction and a log-uniform aspect ratio, each try
// drawing 4 keyed uniforms (stream 0, draws 4t .. 4t + 3), the first box that fits placed
// uniformly; else the whole image cut to the nearest allowed ratio, centred.
inline void random_resized_crop_boxes(uint64_t seed, uint64_t epoch, const int64_t* heights, const int64_t* widths,
                                      const int64_t* indices, int64_t n, const ResizedCropRange& r, int64_t* out) {
  constexpr int kTries = 10;
  // numpy's _randint: uniform integers in [0, high) from a draw
  const auto randint = [](double draw, int64_t high) { return std::min(static_cast<int64_t>(draw * high), high - 1); };
  const uint64_t key = keyed_stream_key(seed, epoch, 0);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t sample = keyed_sample_key(key, indices[i]);
    const int64_t H = heights[i], W = widths[i];
    const double area = static_cast<double>(H * W);
    int64_t* box = out + 4 * i;
    bool found = false;
    for (int t = 0; t < kTries && !found; ++t) {
      const double d[4] = {keyed_draw(sample, 4 * t), keyed_draw(sample, 4 * t + 1), keyed_draw(sample, 4 * t + 2),
                           keyed_draw(sample, 4 * t + 3)};  // a try's draws only when it is tried
      const double target = area * (r.scale0 + d[0] * (r.scale1 - r.scale0));
      const double aspect = std::exp(r.log_ratio0 + d[1] * (r.log_ratio1 - r.log_ratio0));
      const int64_t w = static_cast<int64_t>(std::nearbyint(std::sqrt(target * aspect)));  // half to even
      const int64_t h = static_cast<int64_t>(std::nearbyint(std::sqrt(target / aspect)));
      if (w > 0 && w <= W && h > 0 && h <= H) {
        box[0] = randint(d[2], H - h + 1);
        box[1] = randint(d[3], W - w + 1);
        box[2] = h;
        box[3] = w;
        found = true;
      }
    }
    if (found) continue;
    const double in_ratio = static_cast<double>(W) / static_cast<double>(H);
    int64_t fh = H, fw = W;
    if (in_ratio < r.ratio0) fh = static_cast<int64_t>(std::nearbyint(static_cast<double>(W) / r.ratio0));
    else if (in_ratio > r.ratio1) fw = static_cast<int64_t>(std::nearbyint(static_cast<double>(H) * r.ratio1));
    box[0] = (H - fh) / 2;
    box[1] = (W - fw) / 2;
    box[2] = fh;
    box[3] = fw;
  }
}

}  // namespace gpupipe
