// Launch arguments of the policies' kernels from what a binding receives, shared by gpupipe._C
// (csrc/bindings/policy_bindings.cpp) and gpupipe._C_cuda (cuda/policy_bindings_cuda.cpp): every
// check runs here, before the GIL is released and before any kernel runs; a failure is an
// InvalidArgument (ValueError in Python) naming the argument.
#pragma once

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "augment/augment_args.h"
#include "augment/policy_kernels.h"

namespace gpupipe {

// `host_kinds`: the kinds are readable here (CPU buffers), so their values are checked too.
// kinds, params: [n, slots]; matrices: [n, slots, 6].
inline PolicyArgs policy_args(const std::vector<int64_t>& input, const std::vector<int64_t>& output,
                              const std::vector<int64_t>& kinds, const std::vector<int64_t>& params,
                              const std::vector<int64_t>& matrices, int interpolation,
                              const std::optional<std::vector<double>>& fill, bool host_kinds) {
  const StridedBuffer in = parse_buffer(input, "x", kUInt8, {-1, 3, -1, -1});
  const int64_t n = in.shape[0], h = in.shape[2], w = in.shape[3];
  const StridedBuffer out = parse_buffer(output, "out", kUInt8, {n, 3, h, w});
  const StridedBuffer k = parse_buffer(kinds, "kinds", kInt64, {n, -1});
  const int64_t slots = k.shape[1];
  if (slots < 1) throw InvalidArgument("kinds: needs at least one op slot");
  const StridedBuffer p = parse_buffer(params, "params", kFloat64, {n, slots});
  const StridedBuffer m = parse_buffer(matrices, "matrices", kFloat32, {n, slots, 6});
  for (const auto& [b, name] : {std::make_pair(&k, "kinds"), std::make_pair(&p, "params"), std::make_pair(&m, "matrices")}) {
    require_contiguous(*b, name);
    check_disjoint(out, "out", *b, name);
  }
  check_disjoint(out, "out", in, "x");
  if (interpolation != pixel::kNearest && interpolation != pixel::kBilinear)
    throw InvalidArgument("interpolation must be 0 (nearest) or 1 (bilinear)");
  if (host_kinds)
    for (int64_t i = 0; i < n * slots; ++i) {
      const std::string at = "[" + std::to_string(i / slots) + ", " + std::to_string(i % slots) + "]";
      const int64_t kind = k.as<const int64_t>()[i];
      if (kind < 0 || kind >= policy::kNumKinds)
        throw InvalidArgument("kinds" + at + " = " + std::to_string(kind) +
                              " is not a policy op (gpupipe._C.policy_kinds())");
      // factors, bits and thresholds are small, finite numbers
      const double param = p.as<const double>()[i];
      if (policy::reads_param(static_cast<int32_t>(kind)) && !(std::fabs(param) <= policy::kMaxFactor))
        throw InvalidArgument("params" + at + " = " + std::to_string(param) + " must be finite and within +-" +
                              std::to_string(static_cast<int>(policy::kMaxFactor)));
    }
  PolicyArgs a;
  a.input = batch8(in);
  a.output = reinterpret_cast<uint8_t*>(out.address);
  for (int d = 0; d < 4; ++d) a.out_stride[d] = out.strides[d];
  a.slots = slots;
  a.kinds = k.as<const int64_t>();
  a.params = p.as<const double>();
  a.matrices = m.as<const float>();
  a.interpolation = interpolation;
  a.fill = fill_arg(fill, 255.0);
  return a;
}

// The workspace of a CUDA launch (device memory, so only its buffers are checked): int64 histograms
// and gray sums (counted as their unsigned twins), uint8 tables, none overlapping `output`. The CUDA
// kernels take one op slot per launch.
inline PolicyWorkspace policy_workspace(const PolicyArgs& a, const std::vector<int64_t>& output,
                                        const std::vector<int64_t>& hist, const std::vector<int64_t>& gray_sum,
                                        const std::vector<int64_t>& luts) {
  if (a.slots != 1) throw InvalidArgument("the CUDA kernels take one op slot per launch");
  const int64_t n = a.input.n;
  const StridedBuffer h = parse_buffer(hist, "hist", kInt64, {n, 768});
  const StridedBuffer g = parse_buffer(gray_sum, "gray_sum", kInt64, {n});
  const StridedBuffer l = parse_buffer(luts, "luts", kUInt8, {n, 768});
  const StridedBuffer out = parse_buffer(output, "out", kUInt8, {n, 3, a.input.h, a.input.w});
  for (const auto& [b, name] : {std::make_pair(&h, "hist"), std::make_pair(&g, "gray_sum"), std::make_pair(&l, "luts")}) {
    require_contiguous(*b, name);
    check_disjoint(*b, name, out, "out");
  }
  PolicyWorkspace work;
  work.hist = h.as<unsigned long long>();
  work.gray_sum = g.as<unsigned long long>();
  work.luts = l.as<uint8_t>();
  return work;
}

}  // namespace gpupipe
