// gpupipe._C's decode entry points: header probes, crop and batch decodes, the restart-marker
// transcoder and the test-data encoder. Inputs arrive through the buffer protocol without a copy;
// outputs are written to caller-allocated memory given as a raw address (a torch tensor's data_ptr)
// so this module needs no torch ABI. The GIL is released once per call.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings/bindings.h"
#include "bindings/buffer_view.h"
#include "bindings/released_gil.h"
#include "common/crop_sampling.h"
#include "decode/batch_decode.h"
#include "decode/crop_resize.h"
#include "decode/decode_args.h"
#include "decode/entropy_index.h"
#include "decode/gpu_routes.h"
#include "decode/header_table.h"
#include "decode/huffman_reader.h"
#include "decode/jpeg_decoder.h"
#include "decode/jpeg_encoder.h"
#include "decode/restart.h"
#include "decode/scaled_idct.h"

namespace py = pybind11;

namespace gpupipe {
namespace {

template <size_t N>
py::tuple names(const char* const (&table)[N]) {
  py::tuple t(N);
  for (size_t i = 0; i < N; ++i) t[i] = table[i];
  return t;
}

// ([(index, ErrorKind, message)] errors, [(index, message)] warnings) of a decoded batch.
py::tuple status_lists(const std::vector<SampleStatus>& status) {
  const BatchReport r = batch_report(status);
  return py::make_tuple(py::cast(r.errors), py::cast(r.warnings));
}

// The boxes argument of a batch: an int64 or float64 [n, 4] C-contiguous buffer.
std::vector<Box> boxes_arg(py::handle boxes, size_t n) {
  BufferView view(boxes.ptr(), PyBUF_FORMAT | PyBUF_C_CONTIGUOUS);
  const Py_buffer& v = view.view();
  return read_boxes(view.data(), view.size(), static_cast<size_t>(v.itemsize), v.format ? v.format : "B", n);
}

// A batch's inputs, checked and converted with the GIL held: the encoded bytes (held until the
// decode ends) and the core's arguments.
struct BatchInputs {
  std::vector<BufferView> views;
  BatchArgs args;
};

BatchInputs batch_inputs(py::sequence datas, py::object boxes, uintptr_t out_address, size_t out_nbytes,
                         int out_height, int out_width, bool resize, int mode, bool strict, bool dct_scaling,
                         int num_threads, bool window) {
  check_entropy_index_env();
  const std::vector<Box> box = boxes_arg(boxes, py::len(datas));
  BatchInputs in;
  in.views = buffer_views(datas);
  in.args = batch_args(spans_of(in.views), box,
                       make_request(out_height, out_width, resize, mode, strict, dct_scaling, window), num_threads,
                       out_address, out_nbytes);
  return in;
}

// decode_batch_into, started: the Loader starts batch k + 1 before it waits for batch k.
// Row starts as int64 [N, 6]: offset, skip, the four DC predictions (the entropy index's tests).
py::array_t<int64_t> checkpoint_rows(const std::vector<EntropyCheckpoint>& rows) {
  py::array_t<int64_t> got({static_cast<py::ssize_t>(rows.size()), py::ssize_t{6}});
  auto g = got.mutable_unchecked<2>();
  for (size_t i = 0; i < rows.size(); ++i) {
    g(i, 0) = rows[i].offset;
    g(i, 1) = rows[i].skip;
    for (int c = 0; c < 4; ++c) g(i, 2 + c) = rows[i].pred[c];
  }
  return got;
}

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

// A ragged crop-resize's arguments, read through the buffer protocol and checked by the core.
struct RaggedArgs {
  std::vector<RaggedImage> images;
  std::vector<Box> boxes;
  std::vector<int64_t> slots;
};

RaggedArgs ragged_args(py::handle images, py::handle boxes, py::handle slots) {
  BufferView iv(images.ptr(), PyBUF_FORMAT | PyBUF_C_CONTIGUOUS);
  const Py_buffer& v = iv.view();
  if (v.itemsize != 8 || iv.size() % 32 != 0)
    throw std::invalid_argument("images must be a C-contiguous int64 [n, 4] array of rows (address, height, width, "
                                "pitch), got " + std::to_string(iv.size()) + " bytes of " +
                                std::to_string(v.itemsize) + "-byte items");
  const size_t n = iv.size() / 32;
  RaggedArgs a;
  a.images = ragged_images(read_int64s(iv.data(), iv.size(), static_cast<size_t>(v.itemsize), v.format ? v.format : "B",
                                       4 * n, "images, [n, 4] rows (address, height, width, pitch),"));
  a.boxes = boxes_arg(boxes, n);
  BufferView sv(slots.ptr(), PyBUF_FORMAT | PyBUF_C_CONTIGUOUS);
  const Py_buffer& w = sv.view();
  a.slots = read_int64s(sv.data(), sv.size(), static_cast<size_t>(w.itemsize), w.format ? w.format : "B", n,
                        "slots, [n],");
  return a;
}

// A batch's header table (C-contiguous int64 [n, len(INFO_COLUMNS)]) and its boxes, checked.
struct RoutedBatch {
  py::array_t<int64_t, py::array::c_style> table;
  std::vector<Box> boxes;
};

RoutedBatch routed_batch(py::handle table, py::handle boxes) {
  RoutedBatch b;
  b.table = py::array_t<int64_t, py::array::c_style>::ensure(table);
  if (!b.table || b.table.ndim() != 2 || b.table.shape(1) != static_cast<py::ssize_t>(kInfoWidth))
    throw std::invalid_argument("table must be an int64 [N, len(INFO_COLUMNS)] header table");
  b.boxes = boxes_arg(boxes, static_cast<size_t>(b.table.shape(0)));
  return b;
}

GpuEligibility eligibility(bool window, bool strict, uint32_t colorspaces, int64_t max_pixels, int64_t max_scans,
                           int64_t box_height, int64_t box_width) {
  return GpuEligibility{window, strict, colorspaces, max_pixels, max_scans, box_height, box_width};
}

}  // namespace

void register_routes(py::module_& m) {
  m.def(
      "gpu_refusals",
      [](py::object table, py::object boxes, bool window, bool strict, uint32_t colorspaces, int64_t max_pixels,
         int64_t max_scans, int64_t box_height, int64_t box_width) {
        const RoutedBatch b = routed_batch(table, boxes);
        const GpuEligibility e = eligibility(window, strict, colorspaces, max_pixels, max_scans, box_height, box_width);
        py::array_t<int8_t> out(static_cast<py::ssize_t>(b.boxes.size()));
        int8_t* o = out.mutable_data();
        for (size_t i = 0; i < b.boxes.size(); ++i)
          o[i] = static_cast<int8_t>(gpu_refusal(b.table.data() + kInfoWidth * i, b.boxes[i], e));
        return out;
      },
      py::arg("table"), py::arg("boxes"), py::arg("window"), py::arg("strict"), py::arg("colorspaces"),
      py::arg("max_pixels"), py::arg("max_scans"), py::arg("box_height") = 0, py::arg("box_width") = 0,
      "int8 [N]: why each sample may not go to a GPU decoder (0: it may: gpupipe._backends.gpu_fallback.gpu_eligible; "
      "REFUSALS words the others); colorspaces is a bit mask of COLORSPACES indices; box_height, box_width > 0: "
      "only boxes of that size (no resize).");
  m.def(
      "hybrid_routes",
      [](py::object table, py::object boxes, py::array_t<int64_t, py::array::c_style | py::array::forcecast> indices,
         uint64_t seed, uint64_t epoch, uint64_t stream, double cpu, double hardware, bool has_hardware, bool has_cuda,
         bool window, bool strict, uint32_t colorspaces, int64_t max_pixels, int64_t max_scans, int64_t box_height,
         int64_t box_width) {
        const RoutedBatch b = routed_batch(table, boxes);
        const auto n = static_cast<py::ssize_t>(b.boxes.size());
        if (indices.size() != n) throw std::invalid_argument("indices must have one entry per sample");
        py::array_t<int64_t> route(n);
        py::array_t<int8_t> reason(n);
        hybrid_routes(b.table.data(), b.boxes, indices.data(), seed, epoch, stream,
                      RouteShares{cpu, hardware, has_hardware, has_cuda},
                      eligibility(window, strict, colorspaces, max_pixels, max_scans, box_height, box_width), route.mutable_data(),
                      reason.mutable_data());
        return py::make_tuple(route, reason);
      },
      py::arg("table"), py::arg("boxes"), py::arg("indices"), py::arg("seed"), py::arg("epoch"), py::arg("stream"),
      py::arg("cpu"), py::arg("hardware"), py::arg("has_hardware"), py::arg("has_cuda"), py::arg("window"),
      py::arg("strict"), py::arg("colorspaces"), py::arg("max_pixels"), py::arg("max_scans"), py::arg("box_height") = 0,
      py::arg("box_width") = 0,
      "(route int64 [N]: 0 CPU core, 1 hardware decoder, 2 CUDA decoder; reason int8 [N]: 0 its share, 1 no GPU "
      "decoder may take it, 2 progressive, drawn for the hardware decoder) of a hybrid batch: gpu_eligible, then "
      "each sample's keyed draw against the shares (seed, epoch, stream mod 2**64).");
  m.def(
      "hybrid_ranked_routes",
      [](py::sequence datas, py::object table, py::object boxes,
         py::array_t<int64_t, py::array::c_style | py::array::forcecast> indices,
         py::array_t<int64_t, py::array::c_style | py::array::forcecast> groups, uint64_t seed, uint64_t epoch,
         uint64_t stream, double cpu, double hardware, bool has_hardware, bool has_cuda, int out_h, int out_w,
         bool dct_scaling, bool window, bool strict, uint32_t colorspaces, int64_t max_pixels, int64_t max_scans,
         int64_t box_height, int64_t box_width) {
        const RoutedBatch b = routed_batch(table, boxes);
        const auto n = static_cast<py::ssize_t>(b.boxes.size());
        if (static_cast<py::ssize_t>(py::len(datas)) != n || indices.size() != n || groups.size() != n)
          throw std::invalid_argument("datas, indices and groups must have one entry per sample");
        std::vector<int64_t> nbytes;  // the files' sizes, read here: no Python per sample
        nbytes.reserve(static_cast<size_t>(n));
        for (const BufferView& v : buffer_views(datas)) nbytes.push_back(static_cast<int64_t>(v.size()));
        py::array_t<int64_t> route(n);
        py::array_t<int8_t> reason(n);
        hybrid_ranked_routes(b.table.data(), b.boxes, indices.data(), seed, epoch, stream,
                             RouteShares{cpu, hardware, has_hardware, has_cuda},
                             eligibility(window, strict, colorspaces, max_pixels, max_scans, box_height, box_width),
                             RankInputs{nbytes.data(), groups.data(), out_h, out_w, dct_scaling}, route.mutable_data(),
                             reason.mutable_data());
        return py::make_tuple(route, reason);
      },
      py::arg("datas"), py::arg("table"), py::arg("boxes"), py::arg("indices"), py::arg("groups"), py::arg("seed"),
      py::arg("epoch"), py::arg("stream"), py::arg("cpu"), py::arg("hardware"), py::arg("has_hardware"),
      py::arg("has_cuda"), py::arg("out_height"), py::arg("out_width"), py::arg("dct_scaling"), py::arg("window"),
      py::arg("strict"), py::arg("colorspaces"), py::arg("max_pixels"), py::arg("max_scans"), py::arg("box_height") = 0,
      py::arg("box_width") = 0,
      "(route, reason) as hybrid_routes gives them, by the ranked split: in each run of equal groups, the "
      "samples a GPU decoder may take are ranked by their estimated CPU-to-GPU cost ratio (the file's size in "
      "bytes, header, box, output size, DCT scaling) and the CPU core takes its share of them from the cheapest "
      "(gpupipe._backends.hybrid.assign_ranked is the definition).");
  m.def(
      "hybrid_cost_estimates",
      [](py::object table, py::object boxes, py::array_t<int64_t, py::array::c_style | py::array::forcecast> nbytes,
         int out_h, int out_w, bool dct_scaling) {
        const RoutedBatch b = routed_batch(table, boxes);
        const auto n = static_cast<py::ssize_t>(b.boxes.size());
        if (nbytes.size() != n) throw std::invalid_argument("nbytes must have one entry per sample");
        py::array_t<double> cost({n, static_cast<py::ssize_t>(2)});
        auto c = cost.mutable_unchecked<2>();
        for (py::ssize_t i = 0; i < n; ++i) {
          c(i, 0) = cpu_cost_estimate(b.table.data() + kInfoWidth * i, b.boxes[i], nbytes.data()[i], out_h, out_w,
                                      dct_scaling);
          c(i, 1) = gpu_cost_estimate(nbytes.data()[i]);
        }
        return cost;
      },
      py::arg("table"), py::arg("boxes"), py::arg("nbytes"), py::arg("out_height"), py::arg("out_width"),
      py::arg("dct_scaling"),
      "float64 [N, 2]: each sample's estimated decode ms on a CPU-core thread and on a GPU decoder (the ranked "
      "split's; valid for the samples a GPU decoder may take).");
}

void register_crop_resize(py::module_& m) {
  m.def(
      "crop_resize_ragged",
      [](py::object images, py::object boxes, py::object slots, uintptr_t out_address, size_t out_nbytes,
         int64_t batch, int64_t out_height, int64_t out_width, int64_t channels, bool resize, bool window,
         int num_threads) {
        const RaggedArgs a = ragged_args(images, boxes, slots);
        ReleasedGil released;
        crop_resize_host(plan_crop_resize(a.images, a.boxes, a.slots, out_address, out_nbytes, batch, out_height,
                                          out_width, channels, resize, window),
                         num_threads);
      },
      py::arg("images"), py::arg("boxes"), py::arg("slots"), py::arg("out_address"), py::arg("out_nbytes"),
      py::arg("batch"), py::arg("out_height"), py::arg("out_width"), py::arg("channels"), py::arg("resize"),
      py::arg("window"), py::arg("num_threads"),
      "Crops box i of host image i and resizes it into slot slots[i] of the uint8 [batch, out_height, "
      "out_width, channels] buffer at out_address, on the thread pool.");
  m.def(
      "crop_resize_plan",
      [](py::object images, py::object boxes, py::object slots, uintptr_t out_address, size_t out_nbytes,
         int64_t batch, int64_t out_height, int64_t out_width, int64_t channels, bool resize, bool window) {
        const RaggedArgs a = ragged_args(images, boxes, slots);
        const CropResizePlan plan = plan_crop_resize(a.images, a.boxes, a.slots, out_address, out_nbytes, batch,
                                                     out_height, out_width, channels, resize, window);
        return py::make_tuple(py::bytes(reinterpret_cast<const char*>(plan.samples.data()),
                                        plan.samples.size() * sizeof(CropResizeSample)),
                              plan.scratch_bytes);
      },
      py::arg("images"), py::arg("boxes"), py::arg("slots"), py::arg("out_address"), py::arg("out_nbytes"),
      py::arg("batch"), py::arg("out_height"), py::arg("out_width"), py::arg("channels"), py::arg("resize"),
      py::arg("window"),
      "crop_resize_ragged's checks and plan, for the CUDA kernels (_C_cuda.crop_resize_ragged): "
      "(the table of samples as bytes, the scratch bytes it needs).");
}

void register_header(py::module_& m) {
  m.attr("COLORSPACES") = names(kColorSpaceNames);
  m.attr("SUBSAMPLINGS") = names(kSubsamplingNames);
  m.attr("INFO_COLUMNS") = names(kInfoColumns);
  m.attr("MALFORMED_LAYOUT") = kMalformedLayout;
  m.attr("FINER_CHROMA") = kFinerChroma;

  m.def(
      "read_header",
      [](py::object data) -> py::tuple {
        BufferView buf(data.ptr());
        JpegInfo i;
        {
          ReleasedGil released;
          i = thread_decoder().read_header(buf.data(), buf.size());
        }
        return py::make_tuple(i.height, i.width, i.channels, colorspace_name(i.colorspace),
                              subsampling_name(i.subsampling), i.progressive, i.orientation, i.arithmetic,
                              i.restart_interval, i.precision);
      },
      py::arg("data"),
      "(height, width, channels, colorspace, subsampling, progressive, orientation, arithmetic, "
      "restart_interval, precision) of a JPEG, from its headers only.");

  m.def(
      "plan_random_resized_crops",
      [](py::sequence datas, uintptr_t out_address, size_t out_nbytes, bool scans, uint64_t seed, uint64_t epoch,
         py::array_t<int64_t, py::array::c_style | py::array::forcecast> indices, double scale0, double scale1,
         double log_ratio0, double log_ratio1, double ratio0, double ratio1) -> py::tuple {
        const std::vector<BufferView> views = buffer_views(datas);
        const std::vector<ByteSpan> inputs = spans_of(views);
        int64_t* table = header_table_output(inputs, out_address, out_nbytes);
        const auto n = static_cast<int64_t>(inputs.size());
        if (indices.size() != n) throw InvalidArgument("indices must have one entry per sample");
        py::array_t<int64_t> boxes({n, int64_t{4}});
        std::vector<IndexedError> failures;
        bool sized = true;
        {
          ReleasedGil released;
          failures = read_header_table(inputs, table, scans);
          constexpr size_t kHeight = info_column("height"), kWidth = info_column("width");
          std::vector<int64_t> h(static_cast<size_t>(n)), w(static_cast<size_t>(n));
          for (int64_t i = 0; i < n && sized; ++i) {
            h[i] = table[kInfoWidth * i + kHeight], w[i] = table[kInfoWidth * i + kWidth];
            constexpr int64_t kMax = int64_t{1} << 31;  // (random_resized_crop_boxes' bound)
            sized = failures.empty() && h[i] >= 1 && w[i] >= 1 && h[i] <= kMax && w[i] <= kMax;
          }
          if (sized)  // every size known: the boxes, as RandomResizedCrop.boxes draws them
            random_resized_crop_boxes(seed, epoch, h.data(), w.data(), indices.data(), n,
                                      ResizedCropRange{scale0, scale1, log_ratio0, log_ratio1, ratio0, ratio1},
                                      boxes.mutable_data());
        }
        return py::make_tuple(py::list(py::cast(failures)), sized ? py::object(boxes) : py::object(py::none()));
      },
      py::arg("datas"), py::arg("out_address"), py::arg("out_nbytes"), py::arg("scans"), py::arg("seed"),
      py::arg("epoch"), py::arg("indices"), py::arg("scale0"), py::arg("scale1"), py::arg("log_ratio0"),
      py::arg("log_ratio1"), py::arg("ratio0"), py::arg("ratio1"),
      "read_header_infos, then, when every header was read, RandomResizedCrop's int64 [N, 4] boxes from the stored "
      "sizes (random_resized_crop_boxes), in one GIL-free call: ([(index, ErrorKind, message)], boxes or None).");
  m.def(
      "read_header_infos",
      [](py::sequence datas, uintptr_t out_address, size_t out_nbytes, bool scans) {
        const std::vector<BufferView> views = buffer_views(datas);
        const std::vector<ByteSpan> inputs = spans_of(views);
        int64_t* out = header_table_output(inputs, out_address, out_nbytes);
        std::vector<IndexedError> failures;
        {
          ReleasedGil released;
          failures = read_header_table(inputs, out, scans);
        }
        return py::list(py::cast(failures));
      },
      py::arg("datas"), py::arg("out_address"), py::arg("out_nbytes"), py::arg("scans") = true,
      "Reads every header of a batch into an int64 [N, len(INFO_COLUMNS)] table at out_address "
      "(GIL released once); returns [(index, ErrorKind, message)] for unreadable headers. Without scans, "
      "the scans column is -1 (counting reads the whole file; only GPU decoders need it).");
}

void register_decode(py::module_& m) {
  m.def(
      "decode_into",
      [](py::object data, uintptr_t out_address, size_t out_nbytes, double top, double left, double height,
         double width, int out_height, int out_width, bool resize, int mode, bool strict, bool dct_scaling,
         int scale_num, bool scaled_box, bool use_restarts, bool window) {
        check_entropy_index_env();
        const BufferView input(data.ptr());
        DecodeRequest req = make_request(out_height, out_width, resize, mode, strict, dct_scaling, window);
        req.box = Box{top, left, height, width};
        req.force_scale_num = scale_num;
        req.scaled_box = scaled_box;
        req.use_restarts = use_restarts;
        const CropOutput out = crop_output(req, input.span(), out_address, out_nbytes);
        DecodeResult r;
        {
          ReleasedGil released;
          r = decode_indexed(input.data(), input.size(), req, out.out, out.row);
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
        double busy = 0;
        {
          ReleasedGil released;
          std::shared_ptr<ThreadPool> pool;
          if (num_threads != 1 && in.args.samples.size() > 1) pool = get_pool(num_threads);
          status = decode_batch(pool.get(), in.args.samples, in.args.options, in.args.out, &busy);
        }
        const py::tuple lists = status_lists(status);
        return py::make_tuple(lists[0], lists[1], busy);
      },
      py::arg("datas"), py::arg("boxes"), py::arg("out_address"), py::arg("out_nbytes"), py::arg("out_height"),
      py::arg("out_width"), py::arg("resize"), py::arg("mode"), py::arg("strict"), py::arg("dct_scaling"),
      py::arg("num_threads"), py::arg("window") = false,
      "Decodes N crops into N x out_height x out_width x C uint8 at out_address on the thread "
      "pool. Returns ([(index, ErrorKind, message)] errors, [(index, message)] warnings, thread-seconds spent "
      "decoding).");

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
          "([(index, ErrorKind, message)] errors, [(index, message)] warnings), once every sample is decoded.")
      .def(
          "busy_seconds", [](const PendingDecode& p) { return p.batch->busy_seconds(); },
          "Thread-seconds the pool spent decoding this batch's samples (all of them after wait()); the "
          "process-wide sum is decode_busy_seconds().");
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
          pending->batch = std::make_unique<PendingBatch>(pool, std::move(in.args.samples), in.args.options,
                                                          in.args.out, &CallScope::end_detached);
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
      "errors and warnings, its busy_seconds() the thread-seconds). The decode holds datas and out_owner (the "
      "output tensor) until it ends.");

  m.def("choose_scale_num", &choose_scale_num, py::arg("box_height"), py::arg("box_width"), py::arg("out_height"),
        py::arg("out_width"));
  m.def(
      "_huffman_reader_stats",
      [] {
        const HuffmanReaderStats s = huffman_reader_stats();
        return dict_of<uint64_t>({{"images", s.images}, {"rejected", s.rejected}, {"skipped", s.skipped},
                                  {"decoded", s.decoded}, {"handed_back", s.handed_back}, {"coasted", s.coasted}});
      },
      "Process-wide counts of gpupipe's Huffman reader (csrc/decode/huffman_reader.h): images it was installed on, "
      "images whose first-MCU check failed, MCUs skipped, MCUs decoded into libjpeg's blocks, MCUs handed back to "
      "libjpeg, MCUs not read at all (the entropy index knew the next row's start).");
  m.def(
      "set_entropy_index_bytes",
      [](uint64_t max_bytes) {
        ReleasedGil released;  // (it may wait for a pool thread's lookup)
        return set_entropy_index_bytes(max_bytes);
      },
      py::arg("max_bytes"),
      "Bounds the process's entropy index (csrc/decode/entropy_index.h; 0: off, and emptied); returns the "
      "previous bound.");
  m.def(
      "entropy_index_stats",
      [] {
        EntropyIndexStats s;
        {
          ReleasedGil released;
          s = entropy_index_stats();
        }
        return dict_of<uint64_t>({{"files", s.files}, {"bytes", s.bytes}, {"max_bytes", s.max_bytes},
                                  {"keyed", s.keyed}, {"found", s.found}, {"learned", s.learned}, {"full", s.full}});
      },
      "The entropy index: files indexed, their bytes, the bound, decodes that hashed their file (the Huffman reader "
      "took the scan), that found rows, that learned rows, whose rows did not fit.");
  m.def("_pause_entropy_index", &pause_entropy_index, py::arg("paused"),
        "Later decodes go without the entropy index (its rows kept) while paused; returns the previous setting.");
  m.def(
      "clear_entropy_index",
      [] {
        ReleasedGil released;
        clear_entropy_index();
      },
      "Empties the entropy index and zeroes its counts.");
  m.def(
      "_code_entropy_rows",
      [](py::array_t<int64_t, py::array::c_style | py::array::forcecast> rows, uint32_t comps,
         std::vector<size_t> appends) -> py::object {
        if (rows.ndim() != 2 || rows.shape(1) != 6) throw InvalidArgument("rows: int64 [N, 6] expected");
        const size_t n = static_cast<size_t>(rows.shape(0));
        std::vector<EntropyCheckpoint> in(n);
        auto r = rows.unchecked<2>();
        for (size_t i = 0; i < n; ++i) {  // (values cast as a decode's record would never leave them)
          in[i].offset = static_cast<uint32_t>(r(i, 0));
          in[i].skip = static_cast<uint8_t>(r(i, 1));
          for (int c = 0; c < 4; ++c) in[i].pred[c] = static_cast<int16_t>(r(i, 2 + c));
        }
        EntropyRows coded;
        coded.comps = comps;
        size_t done = 0;
        appends.push_back(n);
        for (size_t upto : appends) {
          if (upto < done || upto > n) throw InvalidArgument("appends: increasing row counts <= N expected");
          if (!coded.append(in.data() + done, upto - done)) return py::none();
          done = upto;
        }
        std::vector<EntropyCheckpoint> out;
        if (!coded.expand(&out) || out.size() != n) throw std::runtime_error("expand refused its own coding");
        return py::make_tuple(checkpoint_rows(out), coded.coded.size());
      },
      py::arg("rows"), py::arg("comps"), py::arg("appends"),
      "The entropy index's compact coding of row starts (offset, skip, 4 predictions per row), appended in the "
      "given pieces and expanded: (rows, coded bytes), or None when append refused them.");
  m.def(
      "_expand_entropy_rows",
      [](py::bytes coded, uint32_t count, uint32_t comps) -> py::object {
        EntropyRows rows;
        rows.count = count;
        rows.comps = comps;
        const std::string bytes = coded;
        rows.coded.assign(bytes.begin(), bytes.end());
        std::vector<EntropyCheckpoint> out;
        if (!rows.expand(&out)) return py::none();
        return checkpoint_rows(out);
      },
      py::arg("coded"), py::arg("count"), py::arg("comps"),
      "The entropy index's coded rows (any bytes) expanded: int64 [count, 6] (offset, skip, 4 predictions), or None "
      "when they are not `count` valid rows.");
  m.def("_set_huffman_reader", &set_huffman_reader, py::arg("on"),
        "Turns gpupipe's Huffman reader on or off for later decodes; returns the previous setting.");
  m.def("_set_vector_idcts", &set_vector_idcts, py::arg("on"),
        "Turns the AVX2 3x3 and 6x6 IDCTs (csrc/decode/scaled_idct.h) on or off for later decodes; returns the "
        "previous setting.");
  m.def("_vector_idct_swaps", &vector_idct_swaps, "Components whose IDCT the AVX2 kernels took, so far.");
  m.def(
      "_check_vector_idcts",
      [](int size, int64_t blocks, uint64_t seed) {
        VectorIdctCheck c;
        {
          ReleasedGil released;
          c = check_vector_idcts(size, blocks, seed);
        }
        return dict_of<int64_t>({{"blocks", c.blocks}, {"different", c.different}, {"handed", c.handed},
                                 {"overwrote", c.overwrote}});
      },
      py::arg("size"), py::arg("blocks"), py::arg("seed"),
      "Random blocks through the AVX2 IDCT of `size` (3 or 6) and libjpeg's: blocks compared (0: the kernels do "
      "not run here), different, handed to libjpeg's (over the bound), overwrote (wrote outside the block).");
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

void register_encode(py::module_& m) {
  m.def(
      "encode_jpeg",
      [](py::object pixels, int height, int width, int channels, int quality, int h_samp,
         int v_samp, std::string colorspace, bool progressive, bool arithmetic, bool optimize,
         int restart_rows, int restart_blocks, std::vector<std::pair<int, int>> sampling) {
        BufferView buf(pixels.ptr());
        check_encode_input(buf.size(), height, width, channels);
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

}  // namespace gpupipe
