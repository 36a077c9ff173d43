// gpupipe._C_cuda's policy op: validated like the host op (csrc/augment/policy_args.h), launched on
// the caller's stream. One call runs one op slot (three launches: statistics, tables, pixels); the
// Python op (gpupipe/augment/_policy_kernels.py) calls it once per slot.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <vector>

#include "augment/policy_args.h"
#include "check_launch.h"
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
        const PolicyWorkspace work = policy_workspace(a, output, hist, gray_sum, luts);
        check_launch("policy_apply", policy_apply_cuda(a, work, reinterpret_cast<void*>(stream)));
      },
      py::arg("input"), py::arg("output"), py::arg("kinds"), py::arg("params"), py::arg("matrices"),
      py::arg("hist"), py::arg("gray_sum"), py::arg("luts"), py::arg("interpolation"), py::arg("fill"),
      py::arg("stream"));
}

}  // namespace gpupipe
