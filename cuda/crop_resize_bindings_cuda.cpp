// gpupipe._C_cuda's ragged crop-resize: the table planned and checked by gpupipe._C.crop_resize_plan
// (csrc/decode/crop_resize.cpp), checked again against the buffers it writes, launched on the
// caller's stream.
#include <pybind11/pybind11.h>

#include <cstring>
#include <vector>

#include "check_launch.h"
#include "crop_resize_cuda.h"

namespace py = pybind11;

namespace gpupipe {

void register_crop_resize_cuda(py::module_& m) {
  m.def(
      "crop_resize_ragged",
      [](py::bytes table, uintptr_t out_address, uint64_t out_nbytes, int64_t batch, int64_t out_height,
         int64_t out_width, int64_t channels, uintptr_t scratch_address, uint64_t scratch_nbytes, uintptr_t stream) {
        const std::string bytes = table;
        if (bytes.size() % sizeof(CropResizeSample) != 0)
          throw std::invalid_argument("the table is not whole samples: pass crop_resize_plan's table unchanged");
        std::vector<CropResizeSample> samples(bytes.size() / sizeof(CropResizeSample));  // aligned
        if (!samples.empty()) std::memcpy(samples.data(), bytes.data(), bytes.size());
        const uint64_t n = samples.size();
        check_crop_launch(samples.data(), n, out_nbytes, batch, out_height, out_width, channels, scratch_nbytes);
        if (n && (out_address == 0 || scratch_address == 0))
          throw std::invalid_argument("the output or scratch address is null");
        check_launch("crop_resize_ragged",
                     crop_resize_cuda(samples.data(), static_cast<int64_t>(n), reinterpret_cast<uint8_t*>(out_address),
                                      out_height, out_width, channels, reinterpret_cast<uint8_t*>(scratch_address),
                                      reinterpret_cast<void*>(stream)));
      },
      py::arg("table"), py::arg("out_address"), py::arg("out_nbytes"), py::arg("batch"), py::arg("out_height"),
      py::arg("out_width"), py::arg("channels"), py::arg("scratch_address"), py::arg("scratch_nbytes"),
      py::arg("stream"),
      "Runs crop_resize_plan's table on `stream` into the uint8 [batch, out_height, out_width, channels] "
      "device buffer at out_address, with scratch_nbytes (the plan's) of device scratch: three launches.");
}

}  // namespace gpupipe
