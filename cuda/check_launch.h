// Launch errors of the CUDA kernels: every launcher returns the cudaError_t of its launches
// (0 = success), and the bindings turn a failure into a RuntimeError here, the one place.
#pragma once

#include <stdexcept>
#include <string>

namespace gpupipe {

// cudaGetErrorString of a cudaError_t (defined in augment.cu: the bindings need no CUDA headers).
const char* cuda_error_string(int code);

// Throws std::runtime_error ("<what> CUDA launch failed: <CUDA's message>") unless err is 0.
inline void check_launch(const char* what, int err) {
  if (err != 0) throw std::runtime_error(std::string(what) + " CUDA launch failed: " + cuda_error_string(err));
}

}  // namespace gpupipe
