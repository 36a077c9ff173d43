// gpupipe._C_cuda's augmentation ops: validated like the host ops (csrc/augment/augment_args.h),
// launched on the caller's stream.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <vector>

#include "augment/augment_args.h"
#include "augment_cuda.h"
#include "check_launch.h"

namespace py = pybind11;

namespace gpupipe {

void register_augment_cuda(py::module_& m) {
  m.attr("MEAN_BLOCKS") = kMeanBlocks;  // the workspace holds n * MEAN_BLOCKS int64
  m.def(
      "warp_affine",
      [](std::vector<int64_t> input, std::vector<int64_t> matrices, std::vector<int64_t> output,
         int out_type, int interpolation, std::optional<std::vector<double>> fill, uintptr_t stream) {
        const WarpArgs a = warp_args(input, matrices, output, out_type, interpolation, fill);
        check_launch("warp_affine", warp_affine_cuda(a, reinterpret_cast<void*>(stream)));
      },
      py::arg("input"), py::arg("matrices"), py::arg("output"), py::arg("out_type"),
      py::arg("interpolation"), py::arg("fill"), py::arg("stream"));
  m.def(
      "augment",
      [](std::vector<int64_t> input, std::vector<int64_t> params, std::vector<int64_t> output, int out_type,
         int interpolation, std::optional<std::vector<double>> fill, int color, std::vector<double> mean,
         std::vector<double> std_dev, std::vector<int64_t> workspace, uintptr_t stream) {
        // device memory: the parameters' values cannot be read here (the kernels clamp op ids)
        const AugmentArgs a = augment_args(input, params, output, out_type, interpolation, fill, color, mean,
                                           std_dev, std::optional<std::vector<int64_t>>(workspace));
        check_launch("augment", augment_cuda(a, reinterpret_cast<void*>(stream)));
      },
      py::arg("input"), py::arg("params"), py::arg("output"), py::arg("out_type"), py::arg("interpolation"),
      py::arg("fill"), py::arg("color"), py::arg("mean"), py::arg("std"), py::arg("workspace"), py::arg("stream"));
}

}  // namespace gpupipe
