// gpupipe._C_cuda's policy op: validated like the host op (csrc/augment/policy_args.h), launched on
// the caller's stream.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "augment_cuda.h"
#include "augment/policy_args.h"
#include "policy_cuda.h"

namespace py = pybind11;

namespace gpupipe {

void register_policies_cuda(py::module_& m) {
  m.def(
      "policy_apply",
      [](std::vector<int64_t> input, std::vector<int64_t> output, std::vector<int64_t> kinds,
         std::vector<int64_t> params, std::vector<int64_t> matrices, std::vector<int64_t> hist,
         std::vector<int64_t> gray_sum, std::vector<int64_t> luts, int interpolation,
         std::optional<std::vector<double>> fill, uintptr_t stream) {
        const PolicyArgs a = policy_args(input, output, kinds, params, matrices, interpolation, fill, false);
        if (a.slots != 1) throw InvalidArgument("the CUDA kernels take one op slot per launch");
        const int64_t n = a.input.n;
        // The workspace: int64 histograms and gray sums (counted as their unsigned twins), uint8 tables.
        const StridedBuffer h = parse_buffer(hist, "hist", kInt64, {n, 768});
        const StridedBuffer g = parse_buffer(gray_sum, "gray_sum", kInt64, {n});
        const StridedBuffer l = parse_buffer(luts, "luts", kUInt8, {n, 768});
        for (const auto& [b, name] : {std::make_pair(&h, "hist"), std::make_pair(&g, "gray_sum"), std::make_pair(&l, "luts")}) {
          require_contiguous(*b, name);
          check_disjoint(*b, name, parse_buffer(output, "out", kUInt8, {n, 3, a.input.h, a.input.w}), "out");
        }
        PolicyWorkspace work;
        work.hist = h.as<unsigned long long>();
        work.gray_sum = g.as<unsigned long long>();
        work.luts = l.as<uint8_t>();
        const int err = policy_apply_cuda(a, work, reinterpret_cast<void*>(stream));
        if (err != 0) throw std::runtime_error(std::string("policy_apply CUDA launch failed: ") + cuda_error_string(err));
      },
      py::arg("input"), py::arg("output"), py::arg("kinds"), py::arg("params"), py::arg("matrices"),
      py::arg("hist"), py::arg("gray_sum"), py::arg("luts"), py::arg("interpolation"), py::arg("fill"),
      py::arg("stream"));
}

}  // namespace gpupipe
