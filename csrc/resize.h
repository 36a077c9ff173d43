// Antialiased bilinear resampling of 8-bit images, arithmetic-compatible with Pillow's
// Image.resize(size, Image.BILINEAR, box=..., reducing_gap=None): the same coefficients,
// fixed-point rounding and pass order, so results are bit-identical to Pillow's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gpupipe {

class Resampler {
 public:
  // Resizes the (fractional) box [x0, x1) x [y0, y1) of `src` (src_h x src_w x channels, rows of
  // src_stride bytes) to `dst` (dst_h x dst_w x channels, rows of dst_stride bytes).
  // channels is 1, 3 or 4. Taps never reach outside src. Workspace is reused between calls.
  void resize(const uint8_t* src, int src_h, int src_w, int channels, size_t src_stride, double x0,
              double y0, double x1, double y1, uint8_t* dst, int dst_h, int dst_w,
              size_t dst_stride);

 private:
  struct Coeffs {
    int ksize = 0;
    std::vector<int> bounds;       // per output: first tap, number of taps
    std::vector<int32_t> weights;  // per output: ksize fixed-point weights
    std::vector<double> scratch;
  };
  static void compute(int in_size, double in0, double in1, int out_size, Coeffs* c);

  Coeffs horizontal_, vertical_;
  std::vector<uint8_t> temp_;
  std::vector<int32_t> acc_;
};

}  // namespace gpupipe
