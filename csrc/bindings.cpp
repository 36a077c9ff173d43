// pybind11 bindings of the C++ core: the only file here that knows Python. Inputs arrive through
// the buffer protocol without a copy; outputs are written to caller-allocated memory given as a
// raw address (a torch tensor's data_ptr) so this module needs no torch ABI. The GIL is released
// once per call.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include <jpeglib.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "augment_bindings.h"
#include "augment_cpu.h"
#include "batch_decode.h"
#include "errors.h"
#include "jpeg_decoder.h"
#include "jpeg_encoder.h"
#include "erase_cpu.h"
#include "policy_bindings.h"
#include "policy_cpu.h"
#include "restart.h"
#include "thread_pool.h"

namespace py = pybind11;
using namespace gpupipe;

namespace {

// A contiguous read-only view of any object exporting the buffer protocol, released on scope exit.
class BufferView {
 public:
  explicit BufferView(PyObject* obj) {
    if (PyObject_GetBuffer(obj, &view_, PyBUF_SIMPLE) != 0) throw py::error_already_set();
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

 private:
  Py_buffer view_{};
  bool held_ = false;
};

uint8_t* writable_address(uintptr_t address, size_t needed, size_t given) {
  if (address == 0 && needed > 0) throw InvalidArgument("output address is null");
  if (given < needed)
    throw InvalidArgument("output buffer holds " + std::to_string(given) + " bytes, " +
                          std::to_string(needed) + " needed");
  return reinterpret_cast<uint8_t*>(address);
}

ColorMode to_mode(int mode) {
  if (mode != 0 && mode != 1) throw InvalidArgument("mode must be 0 (rgb) or 1 (gray)");
  return static_cast<ColorMode>(mode);
}

py::tuple header_tuple(const JpegInfo& i) {
  return py::make_tuple(i.height, i.width, i.channels, i.colorspace, i.subsampling, i.progressive,
                        i.orientation, i.arithmetic, i.restart_interval, i.precision);
}

void register_errors(py::module_& m) {
  static py::exception<DecodeError> jpeg_error(m, "JpegError", PyExc_RuntimeError);
  static py::exception<TooLarge> bomb_error(m, "DecompressionBombError", jpeg_error.ptr());
  // Translators run newest first: the derived TooLarge must be registered after DecodeError.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const TooLarge& e) {
      py::set_error(bomb_error, e.what());
    } catch (const DecodeError& e) {
      py::set_error(jpeg_error, e.what());
    }
  });
}

void register_header(py::module_& m) {
  m.def(
      "read_header",
      [](py::object data) {
        BufferView buf(data.ptr());
        JpegInfo info;
        {
          py::gil_scoped_release release;
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
        // int64 [N, 5]: height, width, color space (0 gray, 1 ycbcr, 2 rgb, 3 cmyk, 4 ycck,
        // 5 other), components, EXIF orientation; all -1 where the header cannot be read.
        const size_t n = py::len(datas);
        std::vector<BufferView> views;
        views.reserve(n);
        for (size_t i = 0; i < n; ++i) views.emplace_back(datas[i].ptr());
        int64_t* out = reinterpret_cast<int64_t*>(writable_address(out_address, n * 40, out_nbytes));
        py::gil_scoped_release release;
        Decoder& d = thread_decoder();
        for (size_t i = 0; i < n; ++i) {
          int64_t* row = out + 5 * i;
          try {
            JpegInfo info = d.read_header(views[i].data(), views[i].size());
            static const char* names[] = {"gray", "ycbcr", "rgb", "cmyk", "ycck"};
            int64_t cs = 5;
            for (int k = 0; k < 5; ++k)
              if (info.colorspace == names[k]) cs = k;
            row[0] = info.height;
            row[1] = info.width;
            row[2] = cs;
            row[3] = info.channels;
            row[4] = info.orientation;
          } catch (const DecodeError&) {
            row[0] = row[1] = row[2] = row[3] = row[4] = -1;
          }
        }
      },
      py::arg("datas"), py::arg("out_address"), py::arg("out_nbytes"));
}

void register_decode(py::module_& m) {
  m.def(
      "decode_into",
      [](py::object data, uintptr_t out_address, size_t out_nbytes, int64_t top, int64_t left,
         int64_t height, int64_t width, int out_height, int out_width, bool resize, int mode,
         bool strict, bool dct_scaling, int scale_num, bool scaled_box, bool use_restarts) {
        BufferView buf(data.ptr());
        DecodeRequest req;
        req.box = Box{top, left, height, width};
        req.out_height = out_height;
        req.out_width = out_width;
        req.resize = resize;
        req.mode = to_mode(mode);
        req.strict = strict;
        req.dct_scaling = dct_scaling;
        req.force_scale_num = scale_num;
        req.scaled_box = scaled_box;
        req.use_restarts = use_restarts;
        const size_t row = static_cast<size_t>(out_width) * channels_of(req.mode);
        uint8_t* out = writable_address(out_address, row * out_height, out_nbytes);
        DecodeResult r;
        {
          py::gil_scoped_release release;
          r = thread_decoder().decode(buf.data(), buf.size(), req, out, row);
        }
        return py::make_tuple(r.warning.empty() ? py::object(py::none()) : py::str(r.warning),
                              r.scale_num, r.restart_path);
      },
      py::arg("data"), py::arg("out_address"), py::arg("out_nbytes"), py::arg("top"),
      py::arg("left"), py::arg("height"), py::arg("width"), py::arg("out_height"),
      py::arg("out_width"), py::arg("resize") = false, py::arg("mode") = 0,
      py::arg("strict") = false, py::arg("dct_scaling") = true, py::arg("scale_num") = 0,
      py::arg("scaled_box") = false, py::arg("use_restarts") = true,
      "Decodes one crop (optionally resized) into out_height x out_width x C uint8 at "
      "out_address. Returns (warning or None, scale_num used, restart fast path used).");

  m.def(
      "decode_batch_into",
      [](py::sequence datas, py::object boxes, uintptr_t out_address, size_t out_nbytes,
         int out_height, int out_width, bool resize, int mode, bool strict, bool dct_scaling,
         int num_threads) {
        const size_t n = py::len(datas);
        BufferView box_view(boxes.ptr());
        if (box_view.size() != n * 4 * sizeof(int64_t))
          throw InvalidArgument("boxes must be a contiguous int64 array of shape [" +
                                std::to_string(n) + ", 4]");
        const int64_t* b = reinterpret_cast<const int64_t*>(box_view.data());
        std::vector<BufferView> views;
        views.reserve(n);
        std::vector<BatchSample> samples(n);
        for (size_t i = 0; i < n; ++i) {
          views.emplace_back(datas[i].ptr());
          samples[i].data = views.back().data();
          samples[i].size = views.back().size();
          samples[i].box = Box{b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]};
        }
        BatchOptions opt;
        opt.out_height = out_height;
        opt.out_width = out_width;
        opt.resize = resize;
        opt.mode = to_mode(mode);
        opt.strict = strict;
        opt.dct_scaling = dct_scaling;
        if (out_height < 1 || out_width < 1) throw InvalidArgument("output size must be >= 1");
        const size_t slot = static_cast<size_t>(out_height) * out_width * channels_of(opt.mode);
        uint8_t* out = writable_address(out_address, slot * n, out_nbytes);
        std::vector<SampleStatus> status;
        {
          py::gil_scoped_release release;
          std::shared_ptr<ThreadPool> pool;
          if (num_threads != 1 && n > 1) pool = get_pool(num_threads);
          status = decode_batch(pool.get(), samples, opt, out);
        }
        py::list errors, warnings;
        for (size_t i = 0; i < n; ++i) {
          const SampleStatus& s = status[i];
          if (s.error != SampleError::kNone)
            errors.append(py::make_tuple(i, static_cast<int>(s.error), s.message));
          else if (!s.message.empty())
            warnings.append(py::make_tuple(i, s.message));
        }
        return py::make_tuple(errors, warnings);
      },
      py::arg("datas"), py::arg("boxes"), py::arg("out_address"), py::arg("out_nbytes"),
      py::arg("out_height"), py::arg("out_width"), py::arg("resize"), py::arg("mode"),
      py::arg("strict"), py::arg("dct_scaling"), py::arg("num_threads"),
      "Decodes N crops into N x out_height x out_width x C uint8 at out_address on the thread "
      "pool. Returns ([(index, kind, message)] errors, [(index, message)] warnings); kind: "
      "1 invalid argument, 2 decode error, 3 over a limit, 4 internal.");

  m.def("choose_scale_num", &choose_scale_num, py::arg("box_height"), py::arg("box_width"),
        py::arg("out_height"), py::arg("out_width"));
}

void register_restarts(py::module_& m) {
  m.def(
      "transcode_with_restarts",
      [](py::object data, int restart_rows, int restart_mcus) {
        BufferView buf(data.ptr());
        std::vector<uint8_t> out;
        {
          py::gil_scoped_release release;
          out = transcode_with_restarts(buf.data(), buf.size(), restart_rows, restart_mcus);
        }
        return py::bytes(reinterpret_cast<const char*>(out.data()), out.size());
      },
      py::arg("data"), py::arg("restart_rows") = 1, py::arg("restart_mcus") = 0,
      "Lossless transcode with restart markers (identical coefficients, optimised Huffman tables).");
}

void register_runtime(py::module_& m) {
  m.def("default_num_threads", &default_num_threads);
  m.def("pool_threads", &pool_threads, "Worker threads alive in this process's decode pool.");
  m.def("shutdown_pool", [] {
    py::gil_scoped_release release;
    shutdown_pool();
  });
  m.def("get_limits", [] {
    Limits l = get_limits();
    return py::make_tuple(l.max_pixels, l.max_scans, l.max_memory);
  });
  m.def(
      "set_limits",
      [](uint64_t max_pixels, int max_scans, uint64_t max_memory) {
        set_limits(Limits{max_pixels, max_scans, max_memory});
      },
      py::arg("max_pixels"), py::arg("max_scans"), py::arg("max_memory"));
  m.attr("libjpeg_turbo_version") = LIBJPEG_TURBO_VERSION_NUMBER;
  m.attr("jpeg_lib_version") = JPEG_LIB_VERSION;
}

void register_encode(py::module_& m) {
  m.def(
      "encode_jpeg",
      [](py::object pixels, int height, int width, int channels, int quality, int h_samp,
         int v_samp, std::string colorspace, bool progressive, bool arithmetic, bool optimize,
         int restart_rows, int restart_blocks) {
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
        std::vector<uint8_t> bytes;
        {
          py::gil_scoped_release release;
          bytes = encode_jpeg(buf.data(), height, width, channels, o);
        }
        return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      },
      py::arg("pixels"), py::arg("height"), py::arg("width"), py::arg("channels"),
      py::arg("quality") = 90, py::arg("h_samp") = 2, py::arg("v_samp") = 2,
      py::arg("colorspace") = "ycbcr", py::arg("progressive") = false,
      py::arg("arithmetic") = false, py::arg("optimize") = false, py::arg("restart_rows") = 0,
      py::arg("restart_blocks") = 0);
}

void register_augment(py::module_& m) {
  py::dict types;
  for (int t = kUInt8; t <= kInt64; ++t) types[elem_name(t)] = t;
  m.attr("ELEM_TYPES") = types;
  m.def(
      "warp_affine",
      [](std::vector<int64_t> input, std::vector<int64_t> matrices, std::vector<int64_t> output,
         int out_type, int interpolation, std::optional<std::vector<double>> fill, int num_threads) {
        const WarpArgs a = warp_args(input, matrices, output, out_type, interpolation, fill);
        py::gil_scoped_release release;
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
        py::gil_scoped_release release;
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
  }, "The op kinds of policy_apply (csrc/policy_ops.h), name -> number.");
  m.def(
      "policy_apply",
      [](std::vector<int64_t> input, std::vector<int64_t> output, std::vector<int64_t> kinds,
         std::vector<int64_t> params, std::vector<int64_t> matrices, int interpolation,
         std::optional<std::vector<double>> fill, int num_threads) {
        const PolicyArgs a = policy_args(input, output, kinds, params, matrices, interpolation, fill, true);
        py::gil_scoped_release release;
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
        for (int64_t i = 0; i < n; ++i)  // an erased box must lie inside its image
          if (box[4 * i + 2] > 0 && (box[4 * i] < 0 || box[4 * i + 1] < 0 || box[4 * i + 3] < 0 ||
                                     box[4 * i] + box[4 * i + 2] > h || box[4 * i + 1] + box[4 * i + 3] > w))
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
        py::gil_scoped_release release;
        erase_boxes_cpu(a, num_threads);
      },
      py::arg("x"), py::arg("boxes"), py::arg("values"), py::arg("num_threads"),
      "RandomErasing's host kernel: sets each box (top, left, height, width; height 0: none) of x, in "
      "place, to values (one element of x's type per channel).");
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "gpupipe's C++ core (libjpeg-turbo ROI decoding, batch engine). Private: use gpupipe.";
  register_errors(m);
  register_header(m);
  register_decode(m);
  register_runtime(m);
  register_encode(m);
  register_augment(m);
  register_restarts(m);
  register_policies(m);
}
