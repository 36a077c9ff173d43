// gpupipe._C's policy op: the augmentation policies' host kernels (augment/policy_cpu.h), validated
// by the core (augment/policy_args.h) before the GIL is released.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <vector>

#include "augment/policy_args.h"
#include "augment/policy_cpu.h"
#include "bindings/bindings.h"
#include "bindings/released_gil.h"

namespace py = pybind11;

namespace gpupipe {

void register_policies(py::module_& m) {
  m.def("policy_kinds", [] {
    py::dict d;
    for (const policy::KindName& k : policy::kKindNames) d[k.name] = static_cast<int>(k.kind);
    return d;
  }, "The op kinds of policy_apply (csrc/augment/policy_ops.h), name -> number.");
  m.def(
      "policy_apply",
      [](std::vector<int64_t> input, std::vector<int64_t> output, std::vector<int64_t> kinds,
         std::vector<int64_t> params, std::vector<int64_t> matrices, int interpolation,
         std::optional<std::vector<double>> fill, int num_threads) {
        const PolicyArgs a = policy_args(input, output, kinds, params, matrices, interpolation, fill, true);
        ReleasedGil released;
        policy_apply_cpu(a, num_threads);
      },
      py::arg("input"), py::arg("output"), py::arg("kinds"), py::arg("params"), py::arg("matrices"),
      py::arg("interpolation"), py::arg("fill"), py::arg("num_threads"),
      "The op slots of an augmentation policy on a uint8 [N, 3, H, W] batch: sample i undergoes "
      "kinds[i, s] (policy_kinds()) with params[i, s] or matrices[i, s], s = 0, 1, ... Buffers are "
      "[address, extent, type, ndim, shape..., strides...] lists (gpupipe.augment._kernels.buffer).");
}

}  // namespace gpupipe
