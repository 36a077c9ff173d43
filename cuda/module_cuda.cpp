// The entry point of gpupipe._C_cuda, the CUDA launchers, called with buffer descriptions of tensors
// (gpupipe.augment._kernels.buffer) and torch.cuda.current_stream().cuda_stream: one file per topic
// (augment_bindings_cuda.cpp, policy_bindings_cuda.cpp, crop_resize_bindings_cuda.cpp), and nvImageCodec's
// decoders through its C API (nvimgcodec_engine.cpp). Every buffer
// is validated by the core (csrc/augment/*_args.h, csrc/decode/crop_resize_kernels.h) before a launch;
// every launch error becomes a RuntimeError (check_launch.h).
#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace gpupipe {
void register_augment_cuda(py::module_& m);   // augment_bindings_cuda.cpp
void register_policies_cuda(py::module_& m);  // policy_bindings_cuda.cpp
void register_crop_resize_cuda(py::module_& m);  // crop_resize_bindings_cuda.cpp
#ifdef GPUPIPE_NVIMGCODEC
void register_nvimgcodec_engine(py::module_& m);  // nvimgcodec_engine.cpp (built where nvImageCodec's header is)
#endif
}  // namespace gpupipe

PYBIND11_MODULE(_C_cuda, m) {
  m.doc() = "gpupipe's CUDA kernels (private; use gpupipe.augment).";
  gpupipe::register_augment_cuda(m);
  gpupipe::register_policies_cuda(m);
  gpupipe::register_crop_resize_cuda(m);
#ifdef GPUPIPE_NVIMGCODEC
  gpupipe::register_nvimgcodec_engine(m);
#endif
}
