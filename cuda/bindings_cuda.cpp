// pybind11 module gpupipe._C_cuda: the CUDA launcher, called with tensors' data_ptr()s and
// torch.cuda.current_stream().cuda_stream. Every launch error becomes a RuntimeError.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>
#include <vector>

#include <optional>

#include "augment_bindings.h"
#include "augment_cuda.h"
#include "fused_augment_cuda.h"

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
  m.def(
      "fused_color_affine",
      [](uintptr_t input, bool input_is_uint8, int64_t n, int64_t h, int64_t w,
         std::vector<int64_t> strides, uintptr_t matrices, uintptr_t hflip, uintptr_t vflip,
         uintptr_t output, int out_dtype, uintptr_t stream) {
        if (strides.size() != 4) throw std::invalid_argument("strides must have 4 entries");
        if (out_dtype < 0 || out_dtype > 2) throw std::invalid_argument("unknown output dtype");
        const gpupipe::fused::FusedArgs a = gpupipe::fused::make_args(
            input, input_is_uint8, n, h, w, strides.data(), matrices, hflip, vflip, output, out_dtype);
        int err = gpupipe::fused_color_affine_cuda(a, reinterpret_cast<void*>(stream));
        if (err != 0)
          throw std::runtime_error(std::string("fused_color_affine CUDA launch failed: ") +
                                   gpupipe::cuda_error_string(err));
      },
      py::arg("input"), py::arg("input_is_uint8"), py::arg("n"), py::arg("h"), py::arg("w"),
      py::arg("strides"), py::arg("matrices"), py::arg("hflip"), py::arg("vflip"),
      py::arg("output"), py::arg("out_dtype"), py::arg("stream"));
  m.def(
      "warp_affine",
      [](std::vector<int64_t> input, std::vector<int64_t> matrices, std::vector<int64_t> output,
         int out_type, int interpolation, std::optional<std::vector<double>> fill, uintptr_t stream) {
        const gpupipe::WarpArgs a = gpupipe::warp_args(input, matrices, output, out_type, interpolation, fill);
        check_launch("warp_affine", gpupipe::warp_affine_cuda(a, reinterpret_cast<void*>(stream)));
      },
      py::arg("input"), py::arg("matrices"), py::arg("output"), py::arg("out_type"),
      py::arg("interpolation"), py::arg("fill"), py::arg("stream"));
  gpupipe::register_policies_cuda(m);
}
