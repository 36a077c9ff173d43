// gpupipe._C's errors: ErrorKind (common/errors.h) and one Python exception class per data error,
// with the translator that maps the core's exceptions onto them.
#include <pybind11/native_enum.h>
#include <pybind11/pybind11.h>

#include <exception>
#include <string>

#include "bindings/bindings.h"
#include "common/errors.h"

namespace py = pybind11;

namespace gpupipe {
namespace {

// Python exception classes, one per ErrorKind that is a data error (defined here, once).
struct ErrorClasses {
  py::object jpeg, not_jpeg, corrupt, unsupported, bomb, pixels, scans, memory;
  py::object of(ErrorKind k) const {
    switch (k) {
      case ErrorKind::kNotJpeg: return not_jpeg;
      case ErrorKind::kCorrupt: return corrupt;
      case ErrorKind::kUnsupported: return unsupported;
      case ErrorKind::kPixelLimit: return pixels;
      case ErrorKind::kScanLimit: return scans;
      case ErrorKind::kMemoryLimit: return memory;
      case ErrorKind::kInvalidArgument: return py::reinterpret_borrow<py::object>(PyExc_ValueError);
      case ErrorKind::kRead: return py::reinterpret_borrow<py::object>(PyExc_OSError);
      default: return py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
    }
  }
};
ErrorClasses* g_errors = nullptr;  // set once at import; the module holds the references

py::object new_error(py::module_& m, const char* name, py::handle base, const char* doc) {
  const std::string qualified = std::string("gpupipe.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, base.ptr(), nullptr);
  if (!cls) throw py::error_already_set();
  py::object obj = py::reinterpret_steal<py::object>(cls);
  m.attr(name) = obj;
  return obj;
}

}  // namespace

void register_errors(py::module_& m) {
  py::native_enum<ErrorKind>(m, "ErrorKind", "enum.IntEnum",
                             "Why a sample failed; the one list of error kinds (csrc/common/errors.h).")
      .value("NONE", ErrorKind::kNone)
      .value("INVALID_ARGUMENT", ErrorKind::kInvalidArgument)
      .value("NOT_JPEG", ErrorKind::kNotJpeg)
      .value("CORRUPT", ErrorKind::kCorrupt)
      .value("UNSUPPORTED", ErrorKind::kUnsupported)
      .value("PIXEL_LIMIT", ErrorKind::kPixelLimit)
      .value("SCAN_LIMIT", ErrorKind::kScanLimit)
      .value("MEMORY_LIMIT", ErrorKind::kMemoryLimit)
      .value("INTERNAL", ErrorKind::kInternal)
      .value("READ", ErrorKind::kRead)
      .finalize();
  auto* e = new ErrorClasses();  // lives as long as the process (the module is never unloaded)
  e->jpeg = new_error(m, "JpegError", PyExc_RuntimeError,
                      "The data is not a decodable JPEG (or is refused by a limit); the message is libjpeg's.");
  e->not_jpeg = new_error(m, "NotAJpegError", e->jpeg, "Not a JPEG: no JPEG signature, or empty input.");
  e->corrupt = new_error(m, "CorruptJpegError", e->jpeg,
                         "Corrupt or truncated JPEG data (with strict=True, also recoverable corruption).");
  e->unsupported = new_error(m, "UnsupportedJpegError", e->jpeg,
                             "A valid JPEG of a kind libjpeg-turbo 2.x does not decode (12-bit, lossless, ...).");
  e->bomb = new_error(m, "DecompressionBombError", e->jpeg,
                      "Refused by a limit of gpupipe.set_limits (a possible decompression bomb).");
  e->pixels = new_error(m, "PixelLimitError", e->bomb, "More pixels than max_pixels.");
  e->scans = new_error(m, "ScanLimitError", e->bomb, "A progressive JPEG with more scans than max_scans.");
  e->memory = new_error(m, "MemoryLimitError", e->bomb, "The decode needs more working memory than max_memory.");
  g_errors = e;
  py::dict classes;
  for (int k = static_cast<int>(ErrorKind::kInvalidArgument); k <= static_cast<int>(ErrorKind::kRead); ++k)
    classes[py::cast(static_cast<ErrorKind>(k))] = e->of(static_cast<ErrorKind>(k));
  m.attr("ERROR_CLASSES") = classes;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const DecodeError& err) {
      py::set_error(g_errors->of(err.kind), err.what());
    } catch (const InternalError& err) {
      py::set_error(PyExc_RuntimeError, (std::string("gpupipe internal error: ") + err.what()).c_str());
    }
  });
}

}  // namespace gpupipe
