// pybind11 module gpupipe._C_cuda: the CUDA launchers, called with buffer descriptions of tensors
// (gpupipe.augment._kernels.buffer) and torch.cuda.current_stream().cuda_stream. Every buffer is
// validated (csrc/augment/augment_args.h) before a launch; every launch error becomes a RuntimeError.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "augment/augment_args.h"
#include "augment_cuda.h"

namespace py = pybind11;

namespace gpupipe {
void register_policies_cuda(py::module_& m);  // cuda/policy_bindings_cuda.cpp
}  // namespace gpupipe

namespace {

void check_launch(const char* what, int err) {
  if (err != 0)
    throw std::runtime_error(std::string(what) + " CUDA launch failed: " + gpupipe::cuda_error_string(err));
}

}  // namespace

PYBIND11_MODULE(_C_cuda, m) {
  m.doc() = "gpupipe's CUDA kernels (private; use gpupipe.augment).";
  m.attr("MEAN_BLOCKS") = gpupipe::kMeanBlocks;  // the workspace holds n * MEAN_BLOCKS int64
  m.def(
      "warp_affine",
      [](std::vector<int64_t> input, std::vector<int64_t> matrices, std::vector<int64_t> output,
         int out_type, int interpolation, std::optional<std::vector<double>> fill, uintptr_t stream) {
        const gpupipe::WarpArgs a = gpupipe::warp_args(input, matrices, output, out_type, interpolation, fill);
        check_launch("warp_affine", gpupipe::warp_affine_cuda(a, reinterpret_cast<void*>(stream)));
      },
      py::arg("input"), py::arg("matrices"), py::arg("output"), py::arg("out_type"),
      py::arg("interpolation"), py::arg("fill"), py::arg("stream"));
  m.def(
      "augment",
      [](std::vector<int64_t> input, std::vector<int64_t> params, std::vector<int64_t> output, int out_type,
         int interpolation, std::optional<std::vector<double>> fill, int color, std::vector<double> mean,
         std::vector<double> std_dev, std::vector<int64_t> workspace, uintptr_t stream) {
        using namespace gpupipe;
        // device memory: the parameters' values cannot be read here (the kernels clamp op ids)
        const AugmentArgs a = augment_args(input, params, output, out_type, interpolation, fill, color, mean,
                                           std_dev, std::optional<std::vector<int64_t>>(workspace));
        check_launch("augment", augment_cuda(a, reinterpret_cast<void*>(stream)));
      },
      py::arg("input"), py::arg("params"), py::arg("output"), py::arg("out_type"), py::arg("interpolation"),
      py::arg("fill"), py::arg("color"), py::arg("mean"), py::arg("std"), py::arg("workspace"), py::arg("stream"));
  gpupipe::register_policies_cuda(m);
}
