// Antialiased bilinear resampling of 8-bit images, arithmetic-compatible with Pillow's (>= 13)
// Image.resize(size, Image.BILINEAR, box=..., reducing_gap=None): the same coefficients,
// fixed-point rounding and pass order, so results are bit-identical to Pillow's.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace gpupipe {

class Resampler {
 public:
  // Resizes the (fractional) box [x0, x1) x [y0, y1) of `src` (src_h x src_w x channels, rows of
  // src_stride bytes) to `dst` (dst_h x dst_w x channels, rows of dst_stride bytes).
  // channels is 1, 3 or 4. Taps never reach outside src. Workspace is reused between calls.
  // `horizontal_first` is the pass order (pillow_horizontal_first of the image Pillow resizes).
  void resize(const uint8_t* src, int src_h, int src_w, int channels, size_t src_stride, double x0,
              double y0, double x1, double y1, uint8_t* dst, int dst_h, int dst_w,
              size_t dst_stride, bool horizontal_first);

  // Pillow >= 13 (python-pillow/Pillow#9549) runs the vertical pass first when an in_h x in_w
  // image resized to out_h x out_w loses more than twice as many rows as columns. The order
  // decides the intermediate's rounding (results differ by up to 1 level).
  // Sizes are whole numbers, passed as double so a computed size needs no cast (NaN: horizontal).
  static bool pillow_horizontal_first(double in_h, double in_w, double out_h, double out_w) {
    return !(in_h - out_h > 0 && in_h - out_h > 2 * (in_w - out_w));
  }

  // A windowed resize (torchvision's Resize + CenterCrop: the taps read around the box, stopping at the
  // frame's edges): the pixels it reads beyond each side of a box of box_size resized to out_size
  // (the filter's support, max(1, scale), and one more) ...
  static int window_margin(double box_size, int out_size) {
    return static_cast<int>(std::ceil(std::max(1.0, box_size / out_size))) + 1;
  }
  // Whether resizing the box [bx0, bx1) x [by0, by1) of a region_h x region_w region to out_h x
  // out_w is a plain copy: the box is the whole region and has the output's size. A window's margin
  // on one side only, or a fractional box rounded up, can give a smaller box a region of the
  // output's size: that is still a resize.
  static bool is_copy(int64_t region_h, int64_t region_w, double bx0, double by0, double bx1, double by1, int64_t out_h,
                      int64_t out_w) {
    return region_w == out_w && region_h == out_h && bx0 == 0 && by0 == 0 && bx1 == static_cast<double>(region_w) &&
           by1 == static_cast<double>(region_h);
  }
  // ... and its pass order: Pillow's for the whole frame resized to the size that maps the box onto
  // the output.
  static bool window_horizontal_first(int64_t frame_h, int64_t frame_w, double box_h, double box_w, int out_h,
                                      int out_w) {
    return pillow_horizontal_first(static_cast<double>(frame_h), static_cast<double>(frame_w),
                                   std::round(static_cast<double>(frame_h) * (out_h / box_h)),
                                   std::round(static_cast<double>(frame_w) * (out_w / box_w)));
  }

 private:
  struct Coeffs {
    int ksize = 0;
    std::vector<int> bounds;       // per output: first tap, number of taps
    std::vector<int32_t> weights;  // per output: ksize fixed-point weights
  };
  static void compute(int in_size, double in0, double in1, int out_size, Coeffs* c);
  // The horizontal pass over `rows` rows from `first_row`: horizontal_rgb_fast where it applies.
  void run_horizontal(int channels, const uint8_t* src, size_t src_stride, int first_row, int rows, uint8_t* dst,
                      size_t dst_stride, int src_w, int dst_w);
  // The horizontal pass of an RGB image with AVX2, four outputs of two rows at a time (bit-identical
  // to the scalar pass); false when it does not apply (other channel counts, no AVX2, under 4 outputs).
  bool horizontal_rgb_fast(int channels, const uint8_t* src, size_t src_stride, int first_row, int rows,
                           uint8_t* dst, size_t dst_stride, int src_w, int out_w);

  Coeffs horizontal_, vertical_;
  std::vector<uint8_t> temp_;
  std::vector<int32_t> acc_;
  // horizontal_rgb_fast: per output its window's offset and whether it reads the copy of the row's
  // end; the copies of two rows' ends
  std::vector<int32_t> window_offset_;
  std::vector<uint8_t> window_in_tail_, tail_;
};

}  // namespace gpupipe
