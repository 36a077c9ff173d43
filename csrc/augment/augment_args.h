// Launch arguments of the augmentation kernels from what a binding receives, shared by gpupipe._C
// (csrc/bindings/augment_bindings.cpp) and gpupipe._C_cuda (cuda/augment_bindings_cuda.cpp): turns
// the integers of buffer descriptions (common/strided_buffer.h) into validated launch arguments.
// Every check runs here, before the GIL is released and before any kernel runs; a failure is an
// InvalidArgument (ValueError in Python) naming the argument.
#pragma once

#include <math.h>

#include <optional>
#include <string>
#include <vector>

#include "augment/augment_kernels.h"
#include "common/strided_buffer.h"

namespace gpupipe {

// Coordinates are floats: sizes up to 2^24 keep every pixel index exact.
constexpr int64_t kMaxAugmentSide = int64_t{1} << 24;

inline Batch8 batch8(const StridedBuffer& b) {
  Batch8 out;
  out.data = b.as<const uint8_t>();
  out.n = b.shape[0];
  out.h = b.shape[2];
  out.w = b.shape[3];
  for (int d = 0; d < 4; ++d) out.stride[d] = b.strides[d];
  if (out.h >= kMaxAugmentSide || out.w >= kMaxAugmentSide)
    throw InvalidArgument("x: height and width must be below 2^24");
  return out;
}

inline pixel::Fill fill_arg(const std::optional<std::vector<double>>& fill, double hi) {
  pixel::Fill f{false, {0.0f, 0.0f, 0.0f}};
  if (!fill) return f;
  if (fill->size() != 3) throw InvalidArgument("fill must have 3 values (one per channel)");
  for (int c = 0; c < 3; ++c) {
    const double v = (*fill)[c];
    if (!(v >= 0.0 && v <= hi)) throw InvalidArgument("fill values must be within [0, " + std::to_string(hi) + "]");
    f.value[c] = static_cast<float>(v);
  }
  f.enabled = true;
  return f;
}

inline WarpArgs warp_args(const std::vector<int64_t>& input, const std::vector<int64_t>& matrices,
                          const std::vector<int64_t>& output, int out_type, int interpolation,
                          const std::optional<std::vector<double>>& fill) {
  const StridedBuffer in = parse_buffer(input, "x", kUInt8, {-1, 3, -1, -1});
  const int64_t n = in.shape[0], h = in.shape[2], w = in.shape[3];
  const StridedBuffer m = parse_buffer(matrices, "matrix", kFloat32, {n, 2, 3});
  require_contiguous(m, "matrix");
  if (out_type != kUInt8 && out_type != kFloat32) throw InvalidArgument("out_dtype must be uint8 or float32");
  const StridedBuffer out = parse_buffer(output, "out", out_type, {n, 3, h, w});
  check_disjoint(out, "out", in, "x");
  check_disjoint(out, "out", m, "matrix");
  if (interpolation != pixel::kNearest && interpolation != pixel::kBilinear)
    throw InvalidArgument("interpolation must be 0 (nearest) or 1 (bilinear)");
  WarpArgs a;
  a.input = batch8(in);
  a.matrices = m.as<const float>();
  a.interpolation = interpolation;
  a.fill = fill_arg(fill, 255.0);
  a.output = reinterpret_cast<void*>(out.address);
  a.out_type = out_type;
  for (int d = 0; d < 4; ++d) a.out_stride[d] = out.strides[d];
  return a;
}

inline void check_normalization(const std::vector<double>& mean, const std::vector<double>& std_dev, float* m,
                                float* inv_std) {
  if (mean.size() != 3 || std_dev.size() != 3) throw InvalidArgument("mean and std must have 3 values");
  for (int c = 0; c < 3; ++c) {
    if (!isfinite(mean[c]) || std_dev[c] == 0.0 || !isfinite(std_dev[c]))  // a negative std as torchvision's
      throw InvalidArgument("mean must be finite and std finite and not 0");
    m[c] = static_cast<float>(mean[c]);
    inv_std[c] = static_cast<float>(1.0 / std_dev[c]);
  }
}

// Without a workspace (the CPU kernel) the parameters are in host memory and their values are
// checked too; with one (CUDA: n x kMeanBlocks int64 for the reduction) they are device memory.
inline AugmentArgs augment_args(const std::vector<int64_t>& input, const std::vector<int64_t>& params,
                                const std::vector<int64_t>& output, int out_type, int interpolation,
                                const std::optional<std::vector<double>>& fill, int color,
                                const std::vector<double>& mean, const std::vector<double>& std_dev,
                                const std::optional<std::vector<int64_t>>& workspace) {
  const bool host_params = !workspace;
  const StridedBuffer in = parse_buffer(input, "x", kUInt8, {-1, 3, -1, -1});
  const int64_t n = in.shape[0], h = in.shape[2], w = in.shape[3];
  const StridedBuffer p = parse_buffer(params, "params", kFloat32, {n, param::kCount});
  require_contiguous(p, "params");
  if (out_type != kFloat32 && out_type != kBFloat16 && out_type != kFloat16)
    throw InvalidArgument("out_dtype must be float32, bfloat16 or float16");
  const StridedBuffer out = parse_buffer(output, "out", out_type, {n, 3, h, w});
  check_disjoint(out, "out", in, "x");
  check_disjoint(out, "out", p, "params");
  AugmentArgs a;
  if (workspace) {
    if (n > 65535) throw InvalidArgument("x: at most 65535 samples per batch on CUDA");
    const StridedBuffer ws = parse_buffer(*workspace, "workspace", kInt64, {n * kMeanBlocks});
    check_disjoint(ws, "workspace", in, "x");
    check_disjoint(ws, "workspace", p, "params");
    check_disjoint(ws, "workspace", out, "out");
    a.mean_partials = ws.as<int64_t>();
  }
  if (interpolation != pixel::kNearest && interpolation != pixel::kBilinear)
    throw InvalidArgument("interpolation must be 0 (nearest) or 1 (bilinear)");
  if (color != kColorTorchvision && color != kColorLinear) throw InvalidArgument("color must be 0 or 1");
  a.input = batch8(in);
  // contrast's fixed-point sums: 2^24 per pixel at most, kept below 2^62
  if (h * w >= (int64_t{1} << 38)) throw InvalidArgument("x: height * width must be below 2^38");
  a.params = p.as<const float>();
  if (host_params && color == kColorTorchvision) {
    for (int64_t i = 0; i < n; ++i) {
      const float* P = a.params + i * param::kCount;
      int seen = 0;
      for (int k = 0; k < 4; ++k) {
        const float v = P[param::kOrder + k];
        if (v == 0.0f || v == 1.0f || v == 2.0f || v == 3.0f) seen |= 1 << static_cast<int>(v);
      }
      if (seen != 15) throw InvalidArgument("params: order of sample " + std::to_string(i) + " is not a permutation of 0..3");
    }
  }
  a.interpolation = interpolation;
  a.fill = fill_arg(fill, 255.0);
  a.color = color;
  check_normalization(mean, std_dev, a.mean, a.inv_std);
  a.output = reinterpret_cast<void*>(out.address);
  a.out_type = out_type;
  for (int d = 0; d < 4; ++d) a.out_stride[d] = out.strides[d];
  return a;
}

}  // namespace gpupipe
