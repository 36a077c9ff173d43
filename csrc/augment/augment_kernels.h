// Launch arguments of the augmentation kernels, shared by their host build (augment_cpu.h) and the
// CUDA launchers (cuda/augment_cuda.h): plain pointers and sizes, validated by the bindings.
#pragma once

#include <stdint.h>

#include "augment/augment_pixel.h"
#include "common/elem_type.h"

namespace gpupipe {

// A uint8 batch [n, 3, h, w] with any strides (elements = bytes).
struct Batch8 {
  const uint8_t* data = nullptr;
  int64_t n = 0, h = 0, w = 0;
  int64_t stride[4] = {0, 0, 0, 0};  // N, C, H, W

  GPUPIPE_HD pixel::Image8 sample(int64_t i) const {
    return pixel::Image8{data + i * stride[0], h, w, stride[1], stride[2], stride[3]};
  }
};

// warp_affine: out[i, :, y, x] = sample(input[i] at matrices[i] @ (x, y, 1)), same size as the input.
struct WarpArgs {
  Batch8 input;
  const float* matrices = nullptr;  // n x 6, row-major 2x3: output pixel -> input coordinate
  int interpolation = pixel::kNearest;
  pixel::Fill fill{false, {0.0f, 0.0f, 0.0f}};
  void* output = nullptr;  // [n, 3, h, w], any strides
  int out_type = kUInt8;   // kUInt8 (rounded as torchvision) or kFloat32 (0..255, unrounded)
  int64_t out_stride[4] = {0, 0, 0, 0};
};

// The color model of BatchAugment's engine.
enum ColorModel : int {
  kColorTorchvision = 0,  // torchvision v2's float ops, clamps between ops, HSV hue, per-sample order
  kColorLinear = 1,       // one 3x4 matrix per sample (DALI-like), see gpupipe/augment/color_linear.py
};

// Per-sample parameters, float32 [n, kCount], built on the CPU by gpupipe/augment/batch_augment.py
// and copied to the device in one transfer. This is the one definition of the layout: Python writes
// each parameter into the columns of kFields, exported as gpupipe._C.PARAM_LAYOUT and PARAM_COUNT.
namespace param {
constexpr int kMatrix = 0;  // the inverse 2x3 map, output pixel -> input coordinate (flips folded)
// color = kColorTorchvision:
constexpr int kFactors = 6;    // brightness, contrast, saturation, hue (ColorOp order)
constexpr int kOrder = 10;     // the op ids in the sample's order (ColorJitter's fn_idx), as floats
constexpr int kGrayscale = 14; // 0 or 1
// color = kColorLinear: out = A @ rgb + t + mean * u, rgb on the 0..255 scale, normalisation
// folded in, mean = the warped image's mean BT.601 luma in [0, 1]
constexpr int kLinearA = 6;     // row-major
constexpr int kLinearT = 15;
constexpr int kLinearU = 18;
constexpr int kLinearMean = 21; // 1 when the mean is needed (a contrast factor != 1)
constexpr int kCount = 24;

// Each parameter's columns: [first, first + width) of a row.
struct Field {
  const char* name;
  int first, width;
};
constexpr Field kFields[] = {
    {"matrix", kMatrix, 6},   {"factors", kFactors, 4},  {"order", kOrder, 4},    {"grayscale", kGrayscale, 1},
    {"linear_a", kLinearA, 9}, {"linear_t", kLinearT, 3}, {"linear_u", kLinearU, 3}, {"linear_mean", kLinearMean, 1},
};
constexpr bool fields_fit() {
  for (const Field& f : kFields)
    if (f.first < 0 || f.width < 1 || f.first + f.width > kCount) return false;
  return true;
}
static_assert(fields_fit(), "a parameter's columns lie outside the row");

}  // namespace param

// Blocks per sample of the CUDA reduction pass (its partial sums: n x kMeanBlocks int64).
constexpr int kMeanBlocks = 64;

// BatchAugment's engine: per output pixel, sample the warped input, run the color chain, grayscale,
// normalise, store. Contrast's image mean needs the warped pixels first: kept from a first pass
// (the host's planes, the fused CUDA kernel's shared memory) or sampled again (the two-pass path).
struct AugmentArgs {
  Batch8 input;
  const float* params = nullptr;  // n x param::kCount
  int interpolation = pixel::kNearest;
  pixel::Fill fill{false, {0.0f, 0.0f, 0.0f}};
  int color = kColorTorchvision;
  float mean[3] = {0.0f, 0.0f, 0.0f};     // normalisation (color = kColorTorchvision)
  float inv_std[3] = {1.0f, 1.0f, 1.0f};
  void* output = nullptr;  // [n, 3, h, w]: float32 / bfloat16 / float16, any strides
  int out_type = kFloat32;
  int64_t out_stride[4] = {0, 0, 0, 0};
  int64_t* mean_partials = nullptr;  // CUDA only: n x kMeanBlocks, written by pass 1, read by pass 2
};

// True when sample i needs the mean luma of its warped image (a contrast op that is not identity).
GPUPIPE_HD bool needs_mean(const AugmentArgs& a, int64_t i) {
  const float* p = a.params + i * param::kCount;
  return a.color == kColorLinear ? p[param::kLinearMean] != 0.0f : p[param::kFactors + pixel::kContrast] != 1.0f;
}

// --- the chain of one pixel ----------------------------------------------------------------------

// color = kColorLinear: the BT.601 luma of the old one-matrix model, on the 0..255 scale.
GPUPIPE_HD float linear_luma(float r, float g, float b) {
  return pixel::add(pixel::add(pixel::mul(r, 0.299f), pixel::mul(g, 0.587f)), pixel::mul(b, 0.114f));
}

// The k-th op of a sample's order; any value outside 0..3 (only reachable by bypassing the
// bindings' checks) reads as brightness rather than outside the sample's parameters.
GPUPIPE_HD int order_op(const float* P, int k) {
  const float v = P[param::kOrder + k];
  return v >= 1.0f && v <= 3.0f ? static_cast<int>(v) : 0;
}

// Whether op `op` of a sample changes anything: factors 1 (hue 0) are skipped, bit-exact identities
// for brightness, contrast and saturation on values in [0, 1] (hue's RGB -> HSV -> RGB round trip
// would move values by an ULP).
GPUPIPE_HD bool op_active(int op, float factor) { return op == pixel::kHue ? factor != 0.0f : factor != 1.0f; }

// A sample's color ops as they run: the active ones (op_active) in the sample's order, and how many
// of them come before contrast (they run before the image mean is known). Built once per sample.
struct ColorProgram {
  int count = 0, before_mean = 0;
  int op[4] = {0, 0, 0, 0};
  float factor[4] = {0.0f, 0.0f, 0.0f, 0.0f};
};

GPUPIPE_HD ColorProgram color_program(const float* P) {
  ColorProgram prog;
  bool after_contrast = false;
  for (int k = 0; k < 4; ++k) {
    const int op = order_op(P, k);
    after_contrast = after_contrast || op == pixel::kContrast;
    const float f = P[param::kFactors + op];
    if (!op_active(op, f)) continue;
    prog.op[prog.count] = op;
    prog.factor[prog.count] = f;
    ++prog.count;
    if (!after_contrast) prog.before_mean = prog.count;
  }
  return prog;
}

// Op `Op` on K pixels (v[j] = r, g, b in [0, 1]).
template <int Op, int K>
GPUPIPE_HD void color_op_on(float (&v)[K][3], float factor, float contrast_term) {
  for (int j = 0; j < K; ++j) pixel::color_op(Op, &v[j][0], &v[j][1], &v[j][2], factor, contrast_term);
}

// The program's ops [begin, end) on K pixels: one dispatch per op for the K of them.
template <int K>
GPUPIPE_HD void run_ops(const ColorProgram& prog, int begin, int end, float contrast_term, float (&v)[K][3]) {
  for (int k = begin; k < end; ++k) {
    const float f = prog.factor[k];
    switch (prog.op[k]) {
      case pixel::kBrightness: color_op_on<pixel::kBrightness>(v, f, contrast_term); break;
      case pixel::kContrast: color_op_on<pixel::kContrast>(v, f, contrast_term); break;
      case pixel::kSaturation: color_op_on<pixel::kSaturation>(v, f, contrast_term); break;
      default: color_op_on<pixel::kHue>(v, f, contrast_term); break;
    }
  }
}

// The chain of K pixels in two parts, split where contrast needs the image mean (the CUDA kernels
// run these on a few pixels at a time; the host kernel runs the same pixel:: functions over rows, op
// by op, in the same order). Part 1: the sampled pixels (0..255) to what the mean averages: scaled
// to [0, 1] and the ops before contrast (linear: the samples, unchanged).
template <int K>
GPUPIPE_HD void chain_before_mean_px(const AugmentArgs& a, const ColorProgram& prog, float (&v)[K][3]) {
  if (a.color == kColorLinear) return;
  for (int j = 0; j < K; ++j)
    for (int c = 0; c < 3; ++c) v[j][c] = pixel::mul(v[j][c], pixel::kInv255);
  run_ops(prog, 0, prog.before_mean, 0.0f, v);
}

// The luma, in [0, 1], that contrast's image mean averages, of a pixel after part 1.
GPUPIPE_HD float mean_luma(const AugmentArgs& a, const float rgb[3]) {
  if (a.color == kColorLinear) return pixel::mul(linear_luma(rgb[0], rgb[1], rgb[2]), pixel::kInv255);
  return pixel::luma(rgb[0], rgb[1], rgb[2]);
}

// The per-sample constant of the chain that depends on the image mean: contrast's blend term
// (torchvision) or the mean's share of the offset (linear), per channel.
struct MeanTerms {
  float v[3];
};
GPUPIPE_HD MeanTerms mean_terms(const AugmentArgs& a, const float* P, float mean) {
  MeanTerms m;
  if (a.color == kColorLinear) {
    for (int c = 0; c < 3; ++c)
      m.v[c] = pixel::add(P[param::kLinearT + c], pixel::mul(mean, P[param::kLinearU + c]));
  } else {
    m.v[0] = m.v[1] = m.v[2] = pixel::blend_term(P[param::kFactors + pixel::kContrast], mean);
  }
  return m;
}

// color = kColorLinear: out = A @ rgb + term, rgb on the 0..255 scale.
GPUPIPE_HD void linear_color(const float* A, const MeanTerms& terms, float r, float g, float b, float out[3]) {
  for (int c = 0; c < 3; ++c)
    out[c] = pixel::add(pixel::add(pixel::add(pixel::mul(A[3 * c], r), pixel::mul(A[3 * c + 1], g)),
                                   pixel::mul(A[3 * c + 2], b)), terms.v[c]);
}

// Part 2: pixels after part 1 to the output values: contrast and the ops after it, grayscale,
// normalise (linear: the sample's matrix).
template <int K>
GPUPIPE_HD void chain_after_mean_px(const AugmentArgs& a, const float* P, const ColorProgram& prog,
                                    const MeanTerms& terms, float (&v)[K][3]) {
  if (a.color == kColorLinear) {
    for (int j = 0; j < K; ++j) linear_color(P + param::kLinearA, terms, v[j][0], v[j][1], v[j][2], v[j]);
    return;
  }
  run_ops(prog, prog.before_mean, prog.count, terms.v[0], v);
  const bool gray = P[param::kGrayscale] != 0.0f;
  for (int j = 0; j < K; ++j) {
    if (gray) v[j][0] = v[j][1] = v[j][2] = pixel::luma(v[j][0], v[j][1], v[j][2]);
    for (int c = 0; c < 3; ++c) v[j][c] = pixel::normalize(v[j][c], a.mean[c], a.inv_std[c]);
  }
}

}  // namespace gpupipe
