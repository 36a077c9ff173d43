// pybind11 bindings of the C++ core: the only file here that knows Python. Inputs arrive through
// the buffer protocol without a copy; outputs are written to caller-allocated memory given as a
// raw address (a torch tensor's data_ptr) so this module needs no torch ABI. The GIL is released
// once per call.
#include <pybind11/native_enum.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include <jpeglib.h>

#include <atomic>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "augment/augment_args.h"
#include "augment/augment_cpu.h"
#include "augment/augment_params.h"
#include "decode/batch_decode.h"
#include "common/errors.h"
#include "common/file_reader.h"
#include "decode/huffman_reader.h"
#include "decode/jpeg_decoder.h"
#include "decode/jpeg_encoder.h"
#include "augment/erase_cpu.h"
#include "augment/mix_cpu.h"
#include "common/multiversion.h"
#include "augment/policy_args.h"
#include "augment/policy_cpu.h"
#include "bindings/released_gil.h"
#include "decode/restart.h"
#include "common/thread_pool.h"

namespace py = pybind11;
using namespace gpupipe;

namespace {

// How long an exiting interpreter waits for native calls still running on other threads (a batch
// decode takes well under a second; a read stuck on a dead network file system is then abandoned).
constexpr double kExitWaitSeconds = 30.0;

// A contiguous read-only view of any object exporting the buffer protocol, released on scope exit.
class BufferView {
 public:
  explicit BufferView(PyObject* obj, int flags = PyBUF_SIMPLE) {
    if (PyObject_GetBuffer(obj, &view_, flags) != 0) throw py::error_already_set();
    held_ = true;
  }
  BufferView(BufferView&& other) noexcept : view_(other.view_), held_(other.held_) {
    other.held_ = false;
  }
  BufferView(const BufferView&) = delete;
  ~BufferView() {
    if (held_) PyBuffer_Release(&view_);
  }
  const uint8_t* data() const { return static_cast<const uint8_t*>(view_.buf); }
  size_t size() const { return static_cast<size_t>(view_.len); }
  const Py_buffer& view() const { return view_; }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

size_t checked_mul(size_t a, size_t b, const char* what) {
  size_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) throw InvalidArgument(std::string(what) + " is too large");
  return r;
}

bool overlaps(const uint8_t* a, size_t an, const uint8_t* b, size_t bn) {
  return an && bn && a < b + bn && b < a + an;
}

// The caller's output at `address` (a tensor's data_ptr()) of `given` bytes, checked to hold
// `needed` bytes and to share no byte with any input.
uint8_t* writable_address(uintptr_t address, size_t needed, size_t given, const std::vector<BufferView>& inputs = {}) {
  if (address == 0 && needed > 0) throw InvalidArgument("output address is null");
  if (given < needed)
    throw InvalidArgument("output buffer holds " + std::to_string(given) + " bytes, " + std::to_string(needed) +
                          " needed");
  uint8_t* out = reinterpret_cast<uint8_t*>(address);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (overlaps(out, needed, inputs[i].data(), inputs[i].size()))
      throw InvalidArgument("the output buffer overlaps input " + std::to_string(i) + ": decode into separate memory");
  return out;
}

ColorMode to_mode(int mode) {
  if (mode != 0 && mode != 1) throw InvalidArgument("mode must be 0 (rgb) or 1 (gray)");
  return static_cast<ColorMode>(mode);
}

// Names of the header enums, index = the enum's value (exported as _C.COLORSPACES / SUBSAMPLINGS).
const char* const kColorSpaces[] = {"gray", "ycbcr", "rgb", "cmyk", "ycck", "unknown"};
const char* const kSubsamplings[] = {"4:4:4", "4:2:2", "4:2:0", "4:4:0", "4:1:1", "4:1:0", "gray", "other"};

py::tuple header_tuple(const JpegInfo& i) {
  return py::make_tuple(i.height, i.width, i.channels, kColorSpaces[static_cast<int>(i.colorspace)],
                        kSubsamplings[static_cast<int>(i.subsampling)], i.progressive, i.orientation, i.arithmetic,
                        i.restart_interval, i.precision);
}

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

// Columns of read_header_infos (exported as _C.INFO_COLUMNS).
const char* const kInfoColumns[] = {"height", "width", "colorspace", "channels", "orientation", "progressive",
                                    "scans", "eoi", "error"};
constexpr size_t kInfoWidth = sizeof(kInfoColumns) / sizeof(kInfoColumns[0]);

// SOS markers in a file (a scan bomb, progressive or not, has thousands); FF DA cannot occur inside
// entropy-coded data (FF is stuffed), so counting marker pairs counts scans.
int64_t count_scans(const uint8_t* d, size_t n) {
  int64_t scans = 0;
  for (size_t p = 0; p + 1 < n;) {
    const void* hit = std::memchr(d + p, 0xFF, n - p - 1);
    if (!hit) break;
    p = static_cast<const uint8_t*>(hit) - d;
    scans += d[p + 1] == 0xDA;
    ++p;
  }
  return scans;
}

// Whether the file ends with its EOI marker: a truncated file does not. GPU decoders decode such
// a file without a word, so the GPU backends leave it to the CPU core (which reports it).
int64_t ends_with_eoi(const uint8_t* d, size_t n) { return n >= 2 && d[n - 2] == 0xFF && d[n - 1] == 0xD9; }

void register_header(py::module_& m) {
  py::tuple colorspaces(std::size(kColorSpaces)), subsamplings(std::size(kSubsamplings)), columns(kInfoWidth);
  for (size_t i = 0; i < std::size(kColorSpaces); ++i) colorspaces[i] = kColorSpaces[i];
  for (size_t i = 0; i < std::size(kSubsamplings); ++i) subsamplings[i] = kSubsamplings[i];
  for (size_t i = 0; i < kInfoWidth; ++i) columns[i] = kInfoColumns[i];
  m.attr("COLORSPACES") = colorspaces;
  m.attr("SUBSAMPLINGS") = subsamplings;
  m.attr("INFO_COLUMNS") = columns;

  m.def(
      "read_header",
      [](py::object data) {
        BufferView buf(data.ptr());
        JpegInfo info;
        {
          ReleasedGil released;
          info = thread_decoder().read_header(buf.data(), buf.size());
        }
        return header_tuple(info);
      },
      py::arg("data"),
      "(height, width, channels, colorspace, subsampling, progressive, orientation, arithmetic, "
      "restart_interval, precision) of a JPEG, from its headers only.");

  m.def(
      "read_header_infos",
      [](py::sequence datas, uintptr_t out_address, size_t out_nbytes) {
        // int64 [N, len(INFO_COLUMNS)] rows; where a header cannot be read, height..scans are -1,
        // `error` its ErrorKind, and the message is in the returned [(index, kind, message)].
        const size_t n = py::len(datas);
        std::vector<BufferView> views;
        views.reserve(n);
        for (size_t i = 0; i < n; ++i) views.emplace_back(datas[i].ptr());
        const size_t needed = checked_mul(n, kInfoWidth * sizeof(int64_t), "the header table");
        if (out_address % alignof(int64_t)) throw InvalidArgument("the header table must be 8-byte aligned");
        int64_t* out = reinterpret_cast<int64_t*>(writable_address(out_address, needed, out_nbytes, views));
        std::vector<std::tuple<size_t, ErrorKind, std::string>> failures;
        {
          ReleasedGil released;
          Decoder& d = thread_decoder();
          for (size_t i = 0; i < n; ++i) {
            int64_t* row = out + kInfoWidth * i;
            try {
              const JpegInfo info = d.read_header(views[i].data(), views[i].size());
              row[0] = info.height;
              row[1] = info.width;
              row[2] = static_cast<int64_t>(info.colorspace);
              row[3] = info.channels;
              row[4] = info.orientation;
              row[5] = info.progressive;
              // every file: a baseline file may also hold many scans (one component each)
              row[6] = count_scans(views[i].data(), views[i].size());
              row[7] = ends_with_eoi(views[i].data(), views[i].size());
              row[8] = static_cast<int64_t>(ErrorKind::kNone);
            } catch (const DecodeError& e) {
              for (size_t c = 0; c + 1 < kInfoWidth; ++c) row[c] = -1;
              row[kInfoWidth - 1] = static_cast<int64_t>(e.kind);
              failures.emplace_back(i, e.kind, e.what());
            }
          }
        }
        py::list result;
        for (auto& [i, kind, message] : failures) result.append(py::make_tuple(i, kind, message));
        return result;
      },
      py::arg("datas"), py::arg("out_address"), py::arg("out_nbytes"),
      "Reads every header of a batch into an int64 [N, len(INFO_COLUMNS)] table at out_address "
      "(GIL released once); returns [(index, ErrorKind, message)] for unreadable headers.");
}

// Boxes of a batch from an int64 or float64 [N, 4] C-contiguous buffer (read without assuming
// alignment).
std::vector<Box> read_boxes(py::handle boxes, size_t n) {
  BufferView view(boxes.ptr(), PyBUF_FORMAT | PyBUF_C_CONTIGUOUS);
  const Py_buffer& v = view.view();
  const std::string format = v.format ? v.format : "B";
  const bool is_int = v.itemsize == 8 && (format == "q" || format == "l" || format == "<q" || format == "<l" ||
                                          format == "=q" || format == "=l");
  const bool is_float = v.itemsize == 8 && (format == "d" || format == "<d" || format == "=d");
  if ((!is_int && !is_float) || view.size() != checked_mul(n, 32, "boxes"))
    throw InvalidArgument("boxes must be a C-contiguous int64 or float64 array of shape [" + std::to_string(n) +
                          ", 4]");
  std::vector<Box> out(n);
  for (size_t i = 0; i < n; ++i) {
    double b[4];
    for (int k = 0; k < 4; ++k) {
      if (is_int) {
        int64_t x;
        std::memcpy(&x, view.data() + 8 * (4 * i + k), 8);
        b[k] = static_cast<double>(x);
      } else {
        std::memcpy(&b[k], view.data() + 8 * (4 * i + k), 8);
      }
    }
    out[i] = Box{b[0], b[1], b[2], b[3]};
  }
  return out;
}

DecodeRequest make_request(int out_height, int out_width, bool resize, int mode, bool strict, bool dct_scaling,
                           bool window) {
  DecodeRequest req;
  req.window = window;
  req.out_height = out_height;
  req.out_width = out_width;
  req.resize = resize;
  req.mode = to_mode(mode);
  req.strict = strict;
  req.dct_scaling = dct_scaling;
  return req;
}

// A batch's inputs, checked and converted with the GIL held: the encoded bytes (held until the
// decode ends), the samples, the options and the output address.
struct BatchInputs {
  std::vector<BufferView> views;
  std::vector<BatchSample> samples;
  BatchOptions options;
  uint8_t* out = nullptr;
};

BatchInputs batch_inputs(py::sequence datas, py::object boxes, uintptr_t out_address, size_t out_nbytes,
                         int out_height, int out_width, bool resize, int mode, bool strict, bool dct_scaling,
                         int num_threads, bool window) {
  const size_t n = py::len(datas);
  const std::vector<Box> box = read_boxes(boxes, n);
  BatchInputs in;
  in.views.reserve(n);
  in.samples.resize(n);
  for (size_t i = 0; i < n; ++i) {
    in.views.emplace_back(datas[i].ptr());
    in.samples[i].data = in.views.back().data();
    in.samples[i].size = in.views.back().size();
    in.samples[i].box = box[i];
  }
  in.options.request = make_request(out_height, out_width, resize, mode, strict, dct_scaling, window);
  if (num_threads < 0 || num_threads > kMaxThreads)
    throw InvalidArgument("num_threads must be within 1.." + std::to_string(kMaxThreads) + " (0: default), got " +
                          std::to_string(num_threads));
  in.out = writable_address(out_address, checked_mul(slot_bytes(in.options.request), n, "the batch output"),
                            out_nbytes, in.views);
  return in;
}

// ([(index, ErrorKind, message)] errors, [(index, message)] warnings) of a decoded batch.
py::tuple status_lists(const std::vector<SampleStatus>& status) {
  py::list errors, warnings;
  for (size_t i = 0; i < status.size(); ++i) {
    const SampleStatus& s = status[i];
    if (s.error != ErrorKind::kNone)
      errors.append(py::make_tuple(i, s.error, s.message));
    else if (!s.message.empty())
      warnings.append(py::make_tuple(i, s.message));
  }
  return py::make_tuple(errors, warnings);
}

void register_decode(py::module_& m) {
  m.def(
      "decode_into",
      [](py::object data, uintptr_t out_address, size_t out_nbytes, double top, double left, double height,
         double width, int out_height, int out_width, bool resize, int mode, bool strict, bool dct_scaling,
         int scale_num, bool scaled_box, bool use_restarts, bool window) {
        std::vector<BufferView> input;
        input.emplace_back(data.ptr());
        DecodeRequest req = make_request(out_height, out_width, resize, mode, strict, dct_scaling, window);
        req.box = Box{top, left, height, width};
        req.force_scale_num = scale_num;
        req.scaled_box = scaled_box;
        req.use_restarts = use_restarts;
        // An empty output size is reported by the decoder, after the box (the more useful message).
        const size_t needed = out_height > 0 && out_width > 0 ? slot_bytes(req) : 0;
        uint8_t* out = writable_address(out_address, needed, out_nbytes, input);
        const size_t row = static_cast<size_t>(out_width) * channels_of(req.mode);
        DecodeResult r;
        {
          ReleasedGil released;
          r = thread_decoder().decode(input[0].data(), input[0].size(), req, out, row);
        }
        return py::make_tuple(r.warning.empty() ? py::object(py::none()) : py::str(r.warning), r.scale_num,
                              r.restart_path);
      },
      py::arg("data"), py::arg("out_address"), py::arg("out_nbytes"), py::arg("top"), py::arg("left"),
      py::arg("height"), py::arg("width"), py::arg("out_height"), py::arg("out_width"), py::arg("resize") = false,
      py::arg("mode") = 0, py::arg("strict") = false, py::arg("dct_scaling") = true, py::arg("scale_num") = 0,
      py::arg("scaled_box") = false, py::arg("use_restarts") = true, py::arg("window") = false,
      "Decodes one crop (optionally resized) into out_height x out_width x C uint8 at "
      "out_address. Returns (warning or None, scale_num used, restart fast path used).");

  m.def(
      "decode_batch_into",
      [](py::sequence datas, py::object boxes, uintptr_t out_address, size_t out_nbytes, int out_height,
         int out_width, bool resize, int mode, bool strict, bool dct_scaling, int num_threads, bool window) {
        const BatchInputs in = batch_inputs(datas, boxes, out_address, out_nbytes, out_height, out_width, resize, mode,
                                            strict, dct_scaling, num_threads, window);
        std::vector<SampleStatus> status;
        {
          ReleasedGil released;
          std::shared_ptr<ThreadPool> pool;
          if (num_threads != 1 && in.samples.size() > 1) pool = get_pool(num_threads);
          status = decode_batch(pool.get(), in.samples, in.options, in.out);
        }
        return status_lists(status);
      },
      py::arg("datas"), py::arg("boxes"), py::arg("out_address"), py::arg("out_nbytes"), py::arg("out_height"),
      py::arg("out_width"), py::arg("resize"), py::arg("mode"), py::arg("strict"), py::arg("dct_scaling"),
      py::arg("num_threads"), py::arg("window") = false,
      "Decodes N crops into N x out_height x out_width x C uint8 at out_address on the thread "
      "pool. Returns ([(index, ErrorKind, message)] errors, [(index, message)] warnings).");

  // decode_batch_into, started: the Loader starts batch k + 1 before it waits for batch k.
  struct PendingDecode {
    std::vector<BufferView> views;  // the encoded bytes, held until the decode ends
    py::object out_owner;           // the output tensor: never freed under the pool's writes
    std::unique_ptr<PendingBatch> batch;
    ~PendingDecode() {
      // Dropped without a wait (an abandoned epoch): the pool still reads `views` and writes the
      // output, so the decode ends first (with the GIL held: the pool's threads never take it).
      batch.reset();
    }
  };
  py::class_<PendingDecode>(m, "PendingDecode")
      .def(
          "wait",
          [](PendingDecode& p) {
            const std::vector<SampleStatus>* status;
            {
              ReleasedGil released;
              status = &p.batch->wait();
            }
            return status_lists(*status);
          },
          "([(index, ErrorKind, message)] errors, [(index, message)] warnings), once every sample is decoded.");
  m.def(
      "decode_batch_start",
      [](py::sequence datas, py::object boxes, py::object out_owner, uintptr_t out_address, size_t out_nbytes,
         int out_height, int out_width, bool resize, int mode, bool strict, bool dct_scaling, int num_threads,
         bool window) {
        BatchInputs in = batch_inputs(datas, boxes, out_address, out_nbytes, out_height, out_width, resize, mode, strict,
                                      dct_scaling, num_threads, window);
        auto pending = std::make_unique<PendingDecode>();
        pending->views = std::move(in.views);  // the samples point into the buffers, not into the views
        pending->out_owner = std::move(out_owner);
        std::shared_ptr<ThreadPool> pool = get_pool(num_threads);
        CallScope::start_detached();  // an exiting interpreter waits for this decode (released_gil.h)
        try {
          pending->batch = std::make_unique<PendingBatch>(pool, std::move(in.samples), in.options, in.out,
                                                          &CallScope::end_detached);
        } catch (...) {
          CallScope::end_detached();
          throw;
        }
        return pending;
      },
      py::arg("datas"), py::arg("boxes"), py::arg("out_owner"), py::arg("out_address"), py::arg("out_nbytes"),
      py::arg("out_height"), py::arg("out_width"), py::arg("resize"), py::arg("mode"), py::arg("strict"),
      py::arg("dct_scaling"), py::arg("num_threads"), py::arg("window") = false,
      "decode_batch_into, started on the pool: returns a PendingDecode at once (its wait() gives the same "
      "result). The decode holds datas and out_owner (the output tensor) until it ends.");

  m.def("choose_scale_num", &choose_scale_num, py::arg("box_height"), py::arg("box_width"), py::arg("out_height"),
        py::arg("out_width"));
  m.def(
      "_huffman_reader_stats",
      [] {
        const HuffmanReaderStats s = huffman_reader_stats();
        py::dict d;
        d["images"] = s.images;
        d["rejected"] = s.rejected;
        d["skipped"] = s.skipped;
        d["decoded"] = s.decoded;
        d["handed_back"] = s.handed_back;
        return d;
      },
      "Process-wide counts of gpupipe's Huffman reader (csrc/decode/huffman_reader.h): images it was installed on, images "
      "whose first-MCU check failed, MCUs skipped, MCUs decoded into libjpeg's blocks, MCUs handed back to libjpeg.");
  m.def("_set_huffman_reader", &set_huffman_reader, py::arg("on"),
        "Turns gpupipe's Huffman reader on or off for later decodes; returns the previous setting.");
}

void register_restarts(py::module_& m) {
  m.def(
      "transcode_with_restarts",
      [](py::object data, int restart_rows, int restart_mcus) {
        BufferView buf(data.ptr());
        std::vector<uint8_t> out;
        {
          ReleasedGil released;
          out = transcode_with_restarts(buf.data(), buf.size(), restart_rows, restart_mcus);
        }
        return py::bytes(reinterpret_cast<const char*>(out.data()), out.size());
      },
      py::arg("data"), py::arg("restart_rows") = 1, py::arg("restart_mcus") = 0,
      "Lossless transcode with restart markers (identical coefficients, optimised Huffman tables).");
}

void register_runtime(py::module_& m) {
  m.def("default_num_threads", &default_num_threads);
  m.def(
      "cpu_share",
      [] {
        const CpuShare s = cpu_share();
        py::dict d;
        d["threads"] = s.threads;
        d["affinity"] = s.affinity;
        d["online"] = s.online;
        d["local_world_size"] = s.local_world_size;
        return d;
      },
      "This process's share of the cores (thread_pool.h): threads, affinity, online, local_world_size.");
  m.attr("MAX_THREADS") = kMaxThreads;
  m.def(
      "cpu_capability",
      [] { return py::make_tuple(cpu_level_name(cpu_level()), cpu_level_name(cpu_level_supported())); },
      "(in force, the CPU's widest): the instruction set level the CPU kernels run at (multiversion.h).");
  m.def(
      "set_cpu_capability",
      [](const std::string& name) {
        for (int l = 0; l < kCpuLevels; ++l)
          if (name == cpu_level_name(static_cast<CpuLevel>(l)))
            return std::string(cpu_level_name(set_cpu_level(static_cast<CpuLevel>(l))));
        throw InvalidArgument("unknown CPU capability '" + name + "': expected default, avx2, avx512 or avx512_vbmi");
      },
      py::arg("name"), "Caps the CPU kernels' level (never above the CPU's); returns the level in force.");
  m.def(
      "_dispatch_level", [] { return cpu_level_name(dispatch([](auto isa) { return decltype(isa)::level; })); },
      "The level a dispatched kernel is built for now (tests: the wider paths do run).");
  m.def("pool_threads", &pool_threads, "Worker threads alive in this process's decode pool.");
  m.def(
      "_pool_selftest",
      [](int num_threads, size_t n, int64_t throw_at) {
        std::atomic<size_t> ran{0};
        {
          ReleasedGil released;
          get_pool(num_threads)->parallel_for(n, [&](size_t i) {
            if (static_cast<int64_t>(i) == throw_at)
              throw std::runtime_error("selftest failure at index " + std::to_string(i));
            ran.fetch_add(1);
          });
        }
        return ran.load();
      },
      py::arg("num_threads"), py::arg("n"), py::arg("throw_at"),
      "Test hook: a parallel_for over n indices whose body throws at throw_at (-1: never); returns "
      "how many indices ran. The exception must come back here, never reach std::terminate.");
  m.def("shutdown_pool", [] {
    ReleasedGil released;
    shutdown_pool();
  });
  m.def("get_limits", [] {
    Limits l = get_limits();
    return py::make_tuple(l.max_pixels, l.max_scans, l.max_memory, l.max_file_size);
  });
  m.def(
      "set_limits",
      [](uint64_t max_pixels, int max_scans, uint64_t max_memory, uint64_t max_file_size) {
        set_limits(Limits{max_pixels, max_scans, max_memory, max_file_size});
      },
      py::arg("max_pixels"), py::arg("max_scans"), py::arg("max_memory"), py::arg("max_file_size"));
  m.attr("libjpeg_turbo_version") = LIBJPEG_TURBO_VERSION_NUMBER;
  {  // libjpeg's message formats, so that libjpeg text printed by another library (DALI's bundled
     // libjpeg-turbo) can be recognised and kept off stderr
    jpeg_error_mgr std_err;
    jpeg_std_error(&std_err);
    py::list formats;
    for (int i = 1; i <= std_err.last_jpeg_message; ++i)
      if (std_err.jpeg_message_table[i]) formats.append(std_err.jpeg_message_table[i]);
    m.attr("LIBJPEG_MESSAGES") = py::tuple(formats);
  }
  m.attr("jpeg_lib_version") = JPEG_LIB_VERSION;
}

void register_files(py::module_& m) {
  m.def(
      "read_files",
      [](const std::vector<std::string>& paths, int num_threads) {
        if (num_threads < 1 || num_threads > kMaxThreads)
          throw InvalidArgument("num_threads must be in [1, " + std::to_string(kMaxThreads) + "]");
        const size_t n = paths.size();
        std::shared_ptr<ThreadPool> pool = num_threads == 1 || n <= 1 ? nullptr : get_pool(num_threads, PoolUse::kIo);
        auto each = [&](size_t first, size_t count, const std::function<void(size_t)>& fn) {
          if (pool) pool->parallel_for(count, [&](size_t k) { fn(first + k); });
          else for (size_t k = 0; k < count; ++k) fn(first + k);
        };
        const uint64_t max_size = get_limits().max_file_size;
        py::list out(n);
        py::list failures;
        // Files are opened and sized without the GIL, their bytes objects made with it, and read
        // straight into those without it again: no copy, and no Python per file but the allocation.
        // A chunk at a time, so that a large batch never holds more descriptors than that.
        constexpr size_t kChunk = 256;
        std::vector<OpenedFile> files;
        std::vector<py::object> objects;
        std::vector<uint64_t> got;
        std::vector<char> grew;
        for (size_t first = 0; first < n; first += kChunk) {
          const size_t count = std::min(kChunk, n - first);
          files.assign(count, OpenedFile());
          {
            ReleasedGil released;
            each(first, count, [&](size_t i) { files[i - first] = open_file(paths[i], max_size); });
          }
          objects.assign(count, py::object());
          try {
            for (size_t k = 0; k < count; ++k)
              if (!files[k].error) {
                objects[k] = py::reinterpret_steal<py::object>(
                    PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(files[k].size)));
                if (!objects[k]) throw py::error_already_set();
              }
          } catch (...) {
            for (OpenedFile& f : files) close_file(&f);
            throw;
          }
          got.assign(count, 0);
          grew.assign(count, 0);
          {
            ReleasedGil released;
            each(first, count, [&](size_t i) {
              const size_t k = i - first;
              if (files[k].error) return;
              bool more = false;
              got[k] = read_into(&files[k], reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(objects[k].ptr())), &more);
              grew[k] = more;
            });
          }
          for (size_t k = 0; k < count; ++k) {
            OpenedFile& f = files[k];
            if (!f.error && grew[k]) {  // changed while read: read it whole again, as one file
              FileRead again;
              {
                ReleasedGil released;
                again = read_whole_file(paths[first + k], max_size);
              }
              f.error = again.error;
              f.message = std::move(again.message);
              objects[k] = py::bytes(again.data);
            } else if (!f.error && got[k] < f.size) {  // shrank while read
              PyObject* obj = objects[k].release().ptr();
              if (_PyBytes_Resize(&obj, static_cast<Py_ssize_t>(got[k])) != 0) throw py::error_already_set();
              objects[k] = py::reinterpret_steal<py::object>(obj);
            }
            if (f.error) {
              failures.append(py::make_tuple(first + k, f.error, f.message.empty() ? std::strerror(f.error) : f.message));
              objects[k] = py::bytes();
            }
            out[first + k] = std::move(objects[k]);
          }
        }
        return py::make_tuple(out, failures);
      },
      py::arg("paths"), py::arg("num_threads"),
      "Reads whole regular files (paths as bytes, os.fsencode) of at most max_file_size bytes on a pool "
      "of num_threads without the GIL; returns (the bytes of each, b'' where a read failed, "
      "[(index, errno, message)] of the failures).");
}

void register_encode(py::module_& m) {
  m.def(
      "encode_jpeg",
      [](py::object pixels, int height, int width, int channels, int quality, int h_samp,
         int v_samp, std::string colorspace, bool progressive, bool arithmetic, bool optimize,
         int restart_rows, int restart_blocks, std::vector<std::pair<int, int>> sampling) {
        BufferView buf(pixels.ptr());
        if (buf.size() != static_cast<size_t>(height) * width * channels)
          throw InvalidArgument("pixels must hold height * width * channels bytes");
        EncodeOptions o;
        o.quality = quality;
        o.h_samp = h_samp;
        o.v_samp = v_samp;
        o.colorspace = std::move(colorspace);
        o.progressive = progressive;
        o.arithmetic = arithmetic;
        o.optimize = optimize;
        o.restart_rows = restart_rows;
        o.restart_blocks = restart_blocks;
        o.sampling = std::move(sampling);
        std::vector<uint8_t> bytes;
        {
          ReleasedGil released;
          bytes = encode_jpeg(buf.data(), height, width, channels, o);
        }
        return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      },
      py::arg("pixels"), py::arg("height"), py::arg("width"), py::arg("channels"),
      py::arg("quality") = 90, py::arg("h_samp") = 2, py::arg("v_samp") = 2,
      py::arg("colorspace") = "ycbcr", py::arg("progressive") = false,
      py::arg("arithmetic") = false, py::arg("optimize") = false, py::arg("restart_rows") = 0,
      py::arg("restart_blocks") = 0, py::arg("sampling") = std::vector<std::pair<int, int>>{});
}

// A float64 / bool / int64 row array of exactly `count` elements (C order; converted if needed).
template <typename T>
using Rows = py::array_t<T, py::array::c_style | py::array::forcecast>;

template <typename T>
const T* rows_of(const Rows<T>& a, int64_t count, const char* name) {
  if (a.size() != count) throw InvalidArgument(std::string(name) + " must have " + std::to_string(count) + " values");
  return a.data();
}

void register_augment_params(py::module_& m) {
  m.def(
      "inverse_affine",
      [](Rows<double> angle, Rows<double> translate, Rows<double> scale, Rows<double> shear, Rows<double> center,
         Rows<bool> hflip, Rows<bool> vflip, int64_t height, int64_t width) {
        const int64_t n = angle.size();
        AffineParams p{angle.data(), rows_of(translate, 2 * n, "translate"), rows_of(scale, n, "scale"),
                       rows_of(shear, 2 * n, "shear"), rows_of(center, 2 * n, "center"),
                       rows_of(hflip, n, "hflip"), rows_of(vflip, n, "vflip")};
        py::array_t<double> out({n, int64_t{2}, int64_t{3}});
        inverse_affine(n, p, height, width, out.mutable_data());
        return out;
      },
      py::arg("angle"), py::arg("translate"), py::arg("scale"), py::arg("shear"), py::arg("center"), py::arg("hflip"),
      py::arg("vflip"), py::arg("height"), py::arg("width"),
      "float64 [N, 2, 3] inverse maps of torchvision's affine, followed by the flips (augment_params.h).");
  m.def(
      "pack_augment_params",
      [](Rows<bool> hflip, Rows<bool> vflip, Rows<double> angle, Rows<double> translate, Rows<double> scale,
         Rows<double> shear, Rows<double> brightness, Rows<double> contrast, Rows<double> saturation, Rows<double> hue,
         Rows<int64_t> order, Rows<bool> grayscale, int64_t height, int64_t width) {
        const int64_t n = angle.size();
        AugmentParams p{rows_of(hflip, n, "hflip"),           rows_of(vflip, n, "vflip"),
                        angle.data(),                         rows_of(translate, 2 * n, "translate"),
                        rows_of(scale, n, "scale"),           rows_of(shear, 2 * n, "shear"),
                        rows_of(brightness, n, "brightness"), rows_of(contrast, n, "contrast"),
                        rows_of(saturation, n, "saturation"), rows_of(hue, n, "hue"),
                        rows_of(order, 4 * n, "order"),       rows_of(grayscale, n, "grayscale")};
        py::array_t<float> out({n, int64_t{param::kCount}});
        pack_augment_params(n, p, height, width, out.mutable_data());
        return out;
      },
      py::arg("hflip"), py::arg("vflip"), py::arg("angle"), py::arg("translate"), py::arg("scale"), py::arg("shear"),
      py::arg("brightness"), py::arg("contrast"), py::arg("saturation"), py::arg("hue"), py::arg("order"),
      py::arg("grayscale"), py::arg("height"), py::arg("width"),
      "BatchAugment's float32 [N, 24] engine rows (color='torchvision') from its parameters, values checked "
      "(ValueError naming the first that cannot apply).");
}

void register_augment(py::module_& m) {
  register_augment_params(m);
  py::dict types;
  for (int t = kUInt8; t <= kInt64; ++t) types[elem_name(t)] = t;
  m.attr("ELEM_TYPES") = types;
  m.def(
      "warp_affine",
      [](std::vector<int64_t> input, std::vector<int64_t> matrices, std::vector<int64_t> output,
         int out_type, int interpolation, std::optional<std::vector<double>> fill, int num_threads) {
        const WarpArgs a = warp_args(input, matrices, output, out_type, interpolation, fill);
        ReleasedGil released;
        warp_affine_cpu(a, num_threads);
      },
      py::arg("input"), py::arg("matrices"), py::arg("output"), py::arg("out_type"),
      py::arg("interpolation"), py::arg("fill"), py::arg("num_threads"),
      "Host kernel of gpupipe.augment.warp_affine. Buffers are [address, extent, type, ndim, "
      "shape..., strides...] lists (gpupipe.augment._kernels.buffer).");
  m.def(
      "augment",
      [](std::vector<int64_t> input, std::vector<int64_t> params, std::vector<int64_t> output, int out_type,
         int interpolation, std::optional<std::vector<double>> fill, int color, std::vector<double> mean,
         std::vector<double> std_dev, int num_threads) {
        const AugmentArgs a =
            augment_args(input, params, output, out_type, interpolation, fill, color, mean, std_dev, std::nullopt);
        ReleasedGil released;
        augment_cpu(a, num_threads);
      },
      py::arg("input"), py::arg("params"), py::arg("output"), py::arg("out_type"), py::arg("interpolation"),
      py::arg("fill"), py::arg("color"), py::arg("mean"), py::arg("std"), py::arg("num_threads"),
      "Host kernel of BatchAugment's engine (gpupipe.augment.fused).");
}


// --- augmentation policies -------------------------------------------------------------------------

void register_policies(py::module_& m) {
  m.def("policy_kinds", [] {
    using namespace policy;
    py::dict d;
    const std::pair<const char*, Kind> kinds[] = {
        {"identity", kIdentity}, {"brightness", kBrightness}, {"color", kColor}, {"contrast", kContrast},
        {"sharpness", kSharpness}, {"posterize", kPosterize}, {"solarize", kSolarize},
        {"autocontrast", kAutoContrast}, {"equalize", kEqualize}, {"invert", kInvert}, {"affine", kAffine}};
    for (const auto& [name, kind] : kinds) d[name] = static_cast<int>(kind);
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
  m.def(
      "erase_boxes",
      [](std::vector<int64_t> images, std::vector<int64_t> boxes, std::vector<int64_t> values, int num_threads) {
        const int type = images.size() > 2 ? static_cast<int>(images[2]) : -1;
        if (type == kInt64 || elem_size(type) == 0)
          throw InvalidArgument("x: must be uint8, float32, bfloat16, float16 or float64");
        const StridedBuffer x = parse_buffer(images, "x", type, {-1, -1, -1, -1});
        const int64_t n = x.shape[0], c = x.shape[1], h = x.shape[2], w = x.shape[3];
        const StridedBuffer b = parse_buffer(boxes, "boxes", kInt64, {n, 4});
        const StridedBuffer v = parse_buffer(values, "values", x.type, {c});
        require_contiguous(b, "boxes");
        require_contiguous(v, "values");
        check_disjoint(x, "x", b, "boxes");
        check_disjoint(x, "x", v, "values");
        const int64_t* box = b.as<const int64_t>();
        for (int64_t i = 0; i < n; ++i)  // an erased box must lie inside its image (overflow-free compares)
          if (box[4 * i + 2] > 0 && (box[4 * i] < 0 || box[4 * i + 1] < 0 || box[4 * i + 3] < 0 ||
                                     box[4 * i] > h || box[4 * i + 1] > w ||
                                     box[4 * i + 2] > h - box[4 * i] || box[4 * i + 3] > w - box[4 * i + 1]))
            throw InvalidArgument("boxes[" + std::to_string(i) + "] is not inside the " + std::to_string(h) + "x" +
                                  std::to_string(w) + " image");
        EraseArgs a;
        a.data = x.as<uint8_t>();
        a.n = n;
        a.c = c;
        a.h = h;
        a.w = w;
        for (int d = 0; d < 4; ++d) a.stride[d] = x.strides[d];
        a.elem_size = elem_size(x.type);
        a.boxes = box;
        a.values = v.as<const uint8_t>();
        ReleasedGil released;
        erase_boxes_cpu(a, num_threads);
      },
      py::arg("x"), py::arg("boxes"), py::arg("values"), py::arg("num_threads"),
      "RandomErasing's host kernel: sets each box (top, left, height, width; height 0: none) of x, in "
      "place, to values (one element of x's type per channel).");
  m.def(
      "mixup_rolled",
      [](std::vector<int64_t> images, std::vector<int64_t> output, double lam, int num_threads) {
        const StridedBuffer x = parse_buffer(images, "images", kFloat32, {-1, -1, -1, -1});
        const StridedBuffer out = parse_buffer(output, "out", kFloat32, {x.shape[0], x.shape[1], x.shape[2], x.shape[3]});
        require_contiguous(x, "images");
        require_contiguous(out, "out");
        check_disjoint(out, "out", x, "images");
        if (!(lam >= 0.0 && lam <= 1.0)) throw InvalidArgument("lam must be within [0, 1]");
        const int64_t per_sample = x.shape[1] * x.shape[2] * x.shape[3];
        ReleasedGil released;
        mixup_rolled_cpu(x.as<const float>(), out.as<float>(), x.shape[0], per_sample, lam, num_threads);
      },
      py::arg("images"), py::arg("out"), py::arg("lam"), py::arg("num_threads"),
      "MixUp's host kernel: out[i] = images[i - 1] * (1 - lam) + images[i] * lam (i - 1 mod N) for a "
      "contiguous float32 [N, C, H, W] batch, rounded as torchvision's expression.");
  m.def(
      "mixup_rolled_inplace",
      [](std::vector<int64_t> images, double lam, int num_threads) {
        const StridedBuffer x = parse_buffer(images, "images", kFloat32, {-1, -1, -1, -1});
        require_contiguous(x, "images");
        if (!(lam >= 0.0 && lam <= 1.0)) throw InvalidArgument("lam must be within [0, 1]");
        const int64_t per_sample = x.shape[1] * x.shape[2] * x.shape[3];
        ReleasedGil released;
        mixup_rolled_inplace_cpu(x.as<float>(), x.shape[0], per_sample, lam, num_threads);
      },
      py::arg("images"), py::arg("lam"), py::arg("num_threads"),
      "mixup_rolled written over images (MixUp(inplace=True)): the same values.");
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "gpupipe's C++ core (libjpeg-turbo ROI decoding, batch engine). Private: use gpupipe.";
  // Before finalization starts, gpupipe calls running on other threads finish (released_gil.h).
  py::module_::import("atexit").attr("register")(py::cpp_function([] { CallScope::wait_for_calls(kExitWaitSeconds); }));
  // `with _C.CallScope():` around a gpupipe call of this thread (gpupipe._exit). A C++ context
  // manager: no Python bytecode runs between the count and the block, so a KeyboardInterrupt cannot
  // leave a call counted (exit would then wait for it), and no frame is added to warnings' stacks.
  struct CallScopeContext {};
  py::class_<CallScopeContext>(m, "CallScope")
      .def(py::init<>())
      .def("__enter__", [](CallScopeContext&) { CallScope::enter(); })
      .def("__exit__", [](CallScopeContext&, py::args) {
        CallScope::leave();
        return false;
      });
  m.def("_thread_parked", &CallScope::parked, py::arg("ident"),
        "Whether the thread of this threading ident has parked for good at exit (never join it).");
  m.def("_interpreter_exiting", &CallScope::exiting,
        "Whether gpupipe's exit hook has run (threads alive then park at their next gpupipe call).");
  m.def("_calls_running", &CallScope::running, "gpupipe calls running now, on any thread (a test hook).");
  m.def("_thread_native_cpu_seconds", &ReleasedGil::native_cpu_seconds,
        "CPU seconds the calling thread has spent in gpupipe's native calls without the GIL.");
  m.def("decode_busy_seconds", &decode_busy_seconds,
        "Thread-seconds all batch decodes of this process have spent decoding samples (pool utilisation).");
  register_errors(m);
  register_header(m);
  register_files(m);
  register_decode(m);
  register_runtime(m);
  register_encode(m);
  register_augment(m);
  register_restarts(m);
  register_policies(m);
}
