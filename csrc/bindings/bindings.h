// gpupipe._C, the pybind11 side of the C++ core: one registration function per topic, each in its
// file here, gathered by module.cpp. The bindings only convert between Python objects and the core's
// types and release the GIL once per call; the checks, tables and result records are the core's
// (csrc/common, csrc/decode, csrc/augment), which knows nothing of Python.
#pragma once

#include <pybind11/pybind11.h>

#include <initializer_list>
#include <utility>

namespace gpupipe {

void register_errors(pybind11::module_& m);   // error_bindings.cpp: ErrorKind, the exception classes
void register_header(pybind11::module_& m);   // decode_bindings.cpp: header probes
void register_decode(pybind11::module_& m);   // decode_bindings.cpp: crop and batch decodes
void register_crop_resize(pybind11::module_& m);  // decode_bindings.cpp: the ragged crop-resize
void register_routes(pybind11::module_& m);   // decode_bindings.cpp: GPU eligibility, the hybrid batch's routes
void register_restarts(pybind11::module_& m); // decode_bindings.cpp: the restart-marker transcoder
void register_encode(pybind11::module_& m);   // decode_bindings.cpp: the test-data encoder
void register_files(pybind11::module_& m);    // runtime_bindings.cpp: batch file reads
void register_runtime(pybind11::module_& m);  // runtime_bindings.cpp: threads, limits, CPU levels, libjpeg
void register_augment(pybind11::module_& m);  // augment_bindings.cpp: warp, BatchAugment, erasing, MixUp
void register_policies(pybind11::module_& m); // policy_bindings.cpp: the augmentation policies' kernel

// A record of the core (counts, shares) as a dict, its fields in order.
template <typename T>
pybind11::dict dict_of(std::initializer_list<std::pair<const char*, T>> fields) {
  pybind11::dict d;
  for (const auto& [name, value] : fields) d[name] = value;
  return d;
}

}  // namespace gpupipe
