// The ragged crop-resize's plan table and its per-value work, shared by the host build
// (crop_resize.cpp) and the CUDA kernels (cuda/crop_resize.cu): both iterate over the same
// (sample, row, byte) values and compute each with the functions here, so the indexing the GPU does
// is the one the host tests run. Plain C++17 (and CUDA under nvcc); no Python, no torch.
//
// A batch runs in three steps, each over all samples: the coefficients, the first pass, the second.
// A sample needs at most two passes (Resampler::resize's: the pass order Pillow picks, a pass whose
// axis keeps its size and box skipped); one of them, or a copy, writes straight into the output.
#pragma once

#include <limits.h>
#include <stdint.h>

#include <stdexcept>
#include <string>

#include "decode/crop_resize_pixel.h"

namespace gpupipe {

enum class CropPass : int32_t { kNone = 0, kCopy = 1, kHorizontal = 2, kVertical = 3 };

// One sample's plan: plain data, copied to the device as is. The region is the pixels the taps may
// read (Resampler's src): the box itself, or with `window` the box and the filter's reach around it.
// Offsets are bytes into the scratch, whose head holds the table (crop_table_bytes). The coefficients:
// horizontal bounds int32 [OW][2] (first tap, count), weights int32 [OW][h_ksize], then the same
// vertically for OH outputs.
struct CropResizeSample {
  uint64_t src = 0;          // address of the region's first pixel
  int64_t src_pitch = 0;     // bytes between its rows
  int64_t coeff_offset = 0;  // the coefficients
  int64_t temp_offset = 0;   // the intermediate between two passes
  double bx0 = 0, by0 = 0, bx1 = 0, by1 = 0;  // the box in region coordinates
  int32_t region_h = 0, region_w = 0;
  int32_t slot = 0;
  int32_t h_ksize = 0, v_ksize = 0;
  CropPass first = CropPass::kNone, second = CropPass::kNone;
  // The intermediate: horizontal first, the region rows the vertical pass reads (from temp_row0), OW
  // pixels wide; vertical first, OH rows of the region's width. A horizontal pass that writes the
  // output alone reads region rows from 0 (temp_row0 = 0).
  int32_t temp_row0 = 0, temp_rows = 0, temp_row_bytes = 0;
  int32_t first_rows = 0, second_rows = 0;  // rows each pass writes (0: no such pass)
};
static_assert(sizeof(CropResizeSample) % 8 == 0, "a table of samples keeps 8-byte alignment");

// Bytes of a table of n samples at the scratch's head, padded so what follows stays aligned.
inline uint64_t crop_table_bytes(uint64_t n) { return (n * sizeof(CropResizeSample) + 255) / 256 * 256; }

// Everything one step needs: the table (device memory for the kernels), the output, the scratch.
struct CropResizeArgs {
  const CropResizeSample* samples = nullptr;
  int64_t n = 0;
  uint8_t* out = nullptr;  // uint8 [batch, out_h, out_w, channels], contiguous
  int64_t out_h = 0, out_w = 0, channels = 0;
  uint8_t* scratch = nullptr;
};

GPUPIPE_HD resample::Axis horizontal_axis(const CropResizeSample& s, int64_t out_w) {
  return resample::axis_of(s.region_w, s.bx0, s.bx1, static_cast<int>(out_w));
}
GPUPIPE_HD resample::Axis vertical_axis(const CropResizeSample& s, int64_t out_h) {
  return resample::axis_of(s.region_h, s.by0, s.by1, static_cast<int>(out_h));
}

struct SampleCoeffs {
  int32_t *h_bounds, *h_weights, *v_bounds, *v_weights;
};
GPUPIPE_HD SampleCoeffs coeffs_of(const CropResizeArgs& a, const CropResizeSample& s) {
  SampleCoeffs c;
  c.h_bounds = reinterpret_cast<int32_t*>(a.scratch + s.coeff_offset);
  c.h_weights = c.h_bounds + 2 * a.out_w;
  c.v_bounds = c.h_weights + a.out_w * s.h_ksize;
  c.v_weights = c.v_bounds + 2 * a.out_h;
  return c;
}

// Step 1, entry j of a sample (0 <= j < out_w + out_h): output j's horizontal taps, then output
// j - out_w's vertical ones.
GPUPIPE_HD void coeff_entry(const CropResizeArgs& a, const CropResizeSample& s, int64_t j) {
  const SampleCoeffs c = coeffs_of(a, s);
  const bool h = j < a.out_w;
  const int k = static_cast<int>(h ? j : j - a.out_w);
  const resample::Axis axis = h ? horizontal_axis(s, a.out_w) : vertical_axis(s, a.out_h);
  int32_t* bounds = h ? c.h_bounds : c.v_bounds;
  int32_t* weights = (h ? c.h_weights : c.v_weights) + static_cast<int64_t>(k) * axis.ksize;
  const int64_t at = 2 * static_cast<int64_t>(k);  // (int64: 2 * k passes int32 for a side past 2^30)
  resample::output_taps(axis, k, &bounds[at], &bounds[at + 1], weights);
}

// One pass of a sample, resolved: where it reads and writes, and with which coefficients.
struct PassView {
  CropPass kind = CropPass::kNone;
  const uint8_t* in = nullptr;
  int64_t in_stride = 0;
  // The input row of output row r (horizontal) or of tap row t (vertical) is r + row_shift / t + row_shift.
  int32_t row_shift = 0;
  uint8_t* out = nullptr;
  int64_t out_stride = 0;
  int32_t rows = 0, row_bytes = 0, channels = 0;
  const int32_t *bounds = nullptr, *weights = nullptr;
  int32_t ksize = 0;
};

GPUPIPE_HD PassView pass_view(const CropResizeArgs& a, const CropResizeSample& s, bool second) {
  PassView v;
  v.kind = second ? s.second : s.first;
  v.rows = second ? s.second_rows : s.first_rows;
  v.channels = static_cast<int32_t>(a.channels);
  uint8_t* temp = a.scratch + s.temp_offset;
  const bool into_temp = !second && s.second != CropPass::kNone;
  if (second) {
    v.in = temp;
    v.in_stride = s.temp_row_bytes;
  } else {
    v.in = reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(s.src));
    v.in_stride = s.src_pitch;
  }
  const int64_t out_row = a.out_w * a.channels;
  v.out = into_temp ? temp : a.out + s.slot * a.out_h * out_row;
  v.out_stride = into_temp ? s.temp_row_bytes : out_row;
  v.row_bytes = static_cast<int32_t>(v.out_stride);
  const SampleCoeffs c = coeffs_of(a, s);
  if (v.kind == CropPass::kHorizontal) {
    v.bounds = c.h_bounds;
    v.weights = c.h_weights;
    v.ksize = s.h_ksize;
    v.row_shift = second ? 0 : s.temp_row0;  // from the region: the rows the vertical pass reads
  } else if (v.kind == CropPass::kVertical) {
    v.bounds = c.v_bounds;
    v.weights = c.v_weights;
    v.ksize = s.v_ksize;
    v.row_shift = second ? -s.temp_row0 : 0;  // the intermediate starts at region row temp_row0
  }
  return v;
}

// Byte b of output row r of a pass.
GPUPIPE_HD uint8_t pass_value(const PassView& v, int32_t r, int32_t b) {
  if (v.kind == CropPass::kHorizontal) {
    const int32_t x = b / v.channels, c = b - x * v.channels;
    const int64_t at = 2 * static_cast<int64_t>(x);  // (int64: 2 * x passes int32 for a side past 2^30)
    return resample::horizontal_value(v.in + static_cast<int64_t>(r + v.row_shift) * v.in_stride, v.channels, c,
                                      v.bounds[at], v.bounds[at + 1],
                                      v.weights + static_cast<int64_t>(x) * v.ksize);
  }
  if (v.kind == CropPass::kVertical) {
    const int64_t at = 2 * static_cast<int64_t>(r);
    return resample::vertical_value(v.in + (static_cast<int64_t>(v.bounds[at]) + v.row_shift) * v.in_stride + b,
                                    static_cast<size_t>(v.in_stride), v.bounds[at + 1],
                                    v.weights + static_cast<int64_t>(r) * v.ksize);
  }
  return v.in[static_cast<int64_t>(r) * v.in_stride + b];  // a copy
}

// Checks a launcher's arguments: the output holding the batch, and the table (the planner's, passed
// back by the caller) against the buffers it writes: every slot inside the output, every coefficient
// and intermediate inside the scratch (after the table), each pass's rows and row bytes inside what it
// writes. The source addresses were checked by the planner (plan_crop_resize). std::invalid_argument
// otherwise.
inline void check_crop_launch(const CropResizeSample* t, uint64_t n, uint64_t out_nbytes, int64_t batch,
                              int64_t out_h, int64_t out_w, int64_t channels, uint64_t scratch_bytes) {
  const bool dims = batch >= 0 && out_h >= 1 && out_w >= 1 && (channels == 1 || channels == 3) &&
                    out_h <= INT32_MAX && out_w <= INT32_MAX / channels;
  if (!dims || static_cast<uint64_t>(batch) > out_nbytes / static_cast<uint64_t>(out_h * out_w * channels))
    throw std::invalid_argument("the output is not a uint8 [batch, height, width, 1 or 3] buffer of its bytes");
  const uint64_t head = crop_table_bytes(n), out_row = static_cast<uint64_t>(out_w * channels);
  for (uint64_t i = 0; i < n; ++i) {
    const CropResizeSample& s = t[i];
    const bool two = s.second != CropPass::kNone;
    // The kernels recompute each axis's taps from the region and box: the table's must agree, or
    // coefficients would overrun the sample's block.
    const bool passes = static_cast<int32_t>(s.first) >= 0 && static_cast<int32_t>(s.first) <= 3 &&
                        static_cast<int32_t>(s.second) >= 0 && static_cast<int32_t>(s.second) <= 3;
    const bool sizes = passes && s.region_w >= 1 && s.region_h >= 1 && s.h_ksize >= 0 && s.v_ksize >= 0 &&
                       s.h_ksize == horizontal_axis(s, out_w).ksize && s.v_ksize == vertical_axis(s, out_h).ksize &&
                       s.temp_rows >= 0 && s.temp_row_bytes >= 0 && s.coeff_offset >= 0 && s.temp_offset >= 0 &&
                       s.first_rows >= 0 && s.second_rows >= 0;
    const uint64_t coeff_bytes = 4 * (static_cast<uint64_t>(out_w) * (2 + static_cast<uint64_t>(s.h_ksize)) +
                                      static_cast<uint64_t>(out_h) * (2 + static_cast<uint64_t>(s.v_ksize)));
    const uint64_t temp_bytes = static_cast<uint64_t>(s.temp_rows) * static_cast<uint64_t>(s.temp_row_bytes);
    const bool fits =
        sizes && s.slot >= 0 && s.slot < batch && static_cast<uint64_t>(s.coeff_offset) >= head &&
        static_cast<uint64_t>(s.coeff_offset) + coeff_bytes <= scratch_bytes &&
        (!two || (static_cast<uint64_t>(s.temp_offset) >= head &&
                  static_cast<uint64_t>(s.temp_offset) + temp_bytes <= scratch_bytes && s.first_rows <= s.temp_rows &&
                  (s.first != CropPass::kHorizontal || static_cast<uint64_t>(s.temp_row_bytes) >= out_row))) &&
        (two || s.first_rows <= out_h) && s.second_rows <= out_h;
    if (!fits)
      throw std::invalid_argument("crop-resize table row " + std::to_string(i) +
                                  " does not fit the output or the scratch: pass the planner's table unchanged");
  }
}

}  // namespace gpupipe
