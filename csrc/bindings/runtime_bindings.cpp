// gpupipe._C's runtime: batch file reads, the thread pools, resource limits, the CPU kernels'
// instruction set level and the libjpeg the core is built with.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "bindings/bindings.h"
#include "bindings/released_gil.h"
#include "common/file_reader.h"
#include "common/errors.h"
#include "common/crop_sampling.h"
#include "common/keyed_uniforms.h"
#include "common/multiversion.h"
#include "common/thread_pool.h"
#include "decode/batch_decode.h"
#include "decode/jpeg_decoder.h"

namespace py = pybind11;

namespace gpupipe {

namespace {

std::string over_batch_budget(uint64_t size, uint64_t before, uint64_t budget) {
  return "the files of its batch read before it hold " + std::to_string(before) + " bytes; its " + std::to_string(size) +
         " more would pass the max_batch_bytes limit of " + std::to_string(budget) +
         " (gpupipe.set_limits(max_batch_bytes=...) raises it): not read";
}

// Reads `paths` chunk by chunk: files opened and sized without the GIL, their destination made
// with it, read straight into it without the GIL again (no copy, no Python per file). With
// `allocate` None each file gets a bytes object; else allocate(nbytes) gives one writable buffer
// per chunk, every file of the chunk is read into it and handed out as a memoryview slice: one
// allocation per batch instead of one per file (a 75 KB bytes object costs ~4 us to free).
// A batch's files (each `group` files in order, 0: all of them; the Loader reads several batches
// in one call) are taken in order while their sizes add up to max_batch_bytes; one that would pass
// it fails alone, named, before it is read (each file within max_file_size, a batch of them could
// still ask for more memory than the host has: 30 sparse files of 1 GB, a MemoryError naming none).
py::tuple read_files_impl(const std::vector<std::string>& paths, int num_threads, const py::object& allocate,
                          size_t group) {
  const Limits limits = get_limits();
  FileBatch batch(paths, num_threads, limits.max_file_size);
  const size_t n = paths.size();
  const size_t per = group == 0 ? std::max<size_t>(n, 1) : group;
  std::vector<uint64_t> taken(n / per + 1, 0);  // bytes admitted in each batch, at most max_batch_bytes
  // admits `size` bytes of file i in its batch; false when they would pass the budget
  const auto admit = [&](size_t i, uint64_t size) {
    uint64_t& t = taken[i / per];
    if (size > limits.max_batch_bytes - t) return false;
    t += size;
    return true;
  };
  const auto refusal = [&](size_t i, uint64_t size) {
    return over_batch_budget(size, taken[i / per], limits.max_batch_bytes);
  };
  const bool arena = !allocate.is_none();
  py::list out(n);
  py::list failures;
  std::vector<py::object> objects;
  std::vector<uint8_t*> dst;
  std::vector<uint64_t> offset;
  for (size_t first = 0; first < n; first += FileBatch::kChunk) {
    const size_t count = std::min(FileBatch::kChunk, n - first);
    {
      ReleasedGil released;
      batch.open(first, count);
    }
    for (size_t k = 0; k < count; ++k) {
      const OpenedFile& f = batch.files()[k];
      if (!f.error && !admit(first + k, f.size)) batch.refuse(k, EFBIG, refusal(first + k, f.size));
    }
    const std::vector<OpenedFile>& files = batch.files();
    objects.assign(count, py::object());
    dst.assign(count, nullptr);
    offset.assign(count, 0);
    py::object view;  // arena: a memoryview of the chunk's buffer, exported while the files are read
    try {
      if (arena) {
        uint64_t total = 0;
        for (size_t k = 0; k < count; ++k)
          if (!files[k].error) {
            offset[k] = total;
            if (files[k].size > static_cast<uint64_t>(PY_SSIZE_T_MAX) - total)
              throw InvalidArgument("the files of a batch hold more bytes than one buffer can");
            total += files[k].size;
          }
        py::object buffer = allocate(py::int_(std::max<uint64_t>(total, 1)));
        view = py::reinterpret_steal<py::object>(PyMemoryView_FromObject(buffer.ptr()));
        if (!view) throw py::error_already_set();
        const Py_buffer* b = PyMemoryView_GET_BUFFER(view.ptr());
        if (b->readonly || !PyBuffer_IsContiguous(b, 'C') || b->len < 0 || static_cast<uint64_t>(b->len) < total)
          throw InvalidArgument("allocate(nbytes) must return a writable contiguous buffer of at least nbytes bytes");
        uint8_t* base = static_cast<uint8_t*>(b->buf);
        for (size_t k = 0; k < count; ++k)
          if (!files[k].error) dst[k] = base + offset[k];
      } else {
        for (size_t k = 0; k < count; ++k)
          if (!files[k].error) {
            objects[k] = py::reinterpret_steal<py::object>(
                PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(files[k].size)));
            if (!objects[k]) throw py::error_already_set();
            dst[k] = reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(objects[k].ptr()));
          }
      }
    } catch (...) {
      batch.close();
      throw;
    }
    {
      ReleasedGil released;
      batch.read(dst);
    }
    for (size_t k = 0; k < count; ++k) {
      int error = files[k].error;
      std::string message = files[k].message;
      // changed while read, or not opened for want of descriptors (the chunk held up to kChunk;
      // they are closed now): read it whole again, as one file
      if ((!error && batch.grew(k)) || error == EMFILE || error == ENFILE) {
        if (!error) taken[(first + k) / per] -= files[k].size;  // (admitted at its first size)
        FileRead again;
        {
          ReleasedGil released;
          again = batch.reread(k);
        }
        error = again.error;
        message = std::move(again.message);
        if (!error && !admit(first + k, again.data.size())) {  // the budget holds for what was read again too
          error = EFBIG;
          message = refusal(first + k, again.data.size());
        } else {
          objects[k] = py::bytes(again.data);
        }
      } else if (!error && arena) {  // what was read: the whole file, or less when it shrank meanwhile
        const auto from = static_cast<py::ssize_t>(offset[k]);
        objects[k] = view[py::slice(from, from + static_cast<py::ssize_t>(batch.got(k)), 1)];
      } else if (!error && batch.got(k) < files[k].size) {  // shrank while read
        PyObject* obj = objects[k].release().ptr();
        if (_PyBytes_Resize(&obj, static_cast<Py_ssize_t>(batch.got(k))) != 0) throw py::error_already_set();
        objects[k] = py::reinterpret_steal<py::object>(obj);
      }
      if (error) {
        failures.append(py::make_tuple(first + k, error, message.empty() ? std::strerror(error) : message));
        objects[k] = py::bytes();
      }
      out[first + k] = std::move(objects[k]);
    }
  }
  return py::make_tuple(out, failures);
}

}  // namespace

void register_files(py::module_& m) {
  m.def(
      "read_files",
      [](const std::vector<std::string>& paths, int num_threads, py::object allocate, size_t group) {
        return read_files_impl(paths, num_threads, allocate, group);
      },
      py::arg("paths"), py::arg("num_threads"), py::arg("allocate") = py::none(), py::arg("group") = 0,
      "Reads whole regular files (paths as bytes, os.fsencode) of at most max_file_size bytes on a pool "
      "of num_threads without the GIL, a batch's (each group files in order; 0: all of them) while they "
      "add up to max_batch_bytes (a file past it fails with EFBIG, not read); returns (the bytes of each, b'' where a read failed, "
      "[(index, errno, message)] of the failures). With allocate (a callable nbytes -> a writable "
      "contiguous buffer), each chunk of up to 256 files is read into one such buffer and the files "
      "are memoryview slices of it (a file that grew while read: bytes).");
}

void register_runtime(py::module_& m) {
  m.def(
      "keyed_uniforms",
      [](uint64_t seed, uint64_t epoch, uint64_t stream,
         py::array_t<int64_t, py::array::c_style | py::array::forcecast> indices, int64_t count) {
        if (count < 0) throw InvalidArgument("count must be >= 0, got " + std::to_string(count));
        const int64_t n = indices.size();
        py::array_t<double> out({n, count});
        keyed_uniforms(seed, epoch, stream, indices.data(), n, count, out.mutable_data());
        return out;
      },
      py::arg("seed"), py::arg("epoch"), py::arg("stream"), py::arg("indices"), py::arg("count"),
      "float64 [N, count] keyed draws in [0, 1): gpupipe.keyed.uniforms (seed, epoch, stream mod 2**64).");
  m.def(
      "random_resized_crop_boxes",
      [](uint64_t seed, uint64_t epoch, py::array_t<int64_t, py::array::c_style | py::array::forcecast> heights,
         py::array_t<int64_t, py::array::c_style | py::array::forcecast> widths,
         py::array_t<int64_t, py::array::c_style | py::array::forcecast> indices, double scale0, double scale1,
         double log_ratio0, double log_ratio1, double ratio0, double ratio1) {
        const int64_t n = indices.size();
        if (heights.size() != n || widths.size() != n)
          throw InvalidArgument("heights, widths and indices must have one entry per sample");
        for (int64_t i = 0; i < n; ++i)
          if (heights.data()[i] < 1 || widths.data()[i] < 1 || heights.data()[i] > (int64_t{1} << 31) ||
              widths.data()[i] > (int64_t{1} << 31))
            throw InvalidArgument("image sizes must be within 1..2^31, sample " + std::to_string(i) + " is not");
        py::array_t<int64_t> out({n, int64_t{4}});
        const ResizedCropRange range{scale0, scale1, log_ratio0, log_ratio1, ratio0, ratio1};
        // microseconds a batch, as keyed_uniforms: the GIL is kept
        random_resized_crop_boxes(seed, epoch, heights.data(), widths.data(), indices.data(), n, range,
                                  out.mutable_data());
        return out;
      },
      py::arg("seed"), py::arg("epoch"), py::arg("heights"), py::arg("widths"), py::arg("indices"),
      py::arg("scale0"), py::arg("scale1"), py::arg("log_ratio0"), py::arg("log_ratio1"), py::arg("ratio0"),
      py::arg("ratio1"),
      "int64 [N, 4] RandomResizedCrop boxes (top, left, height, width) keyed by (seed, epoch, index) mod 2**64: "
      "gpupipe.crops.RandomResizedCrop.boxes.");
  m.def("decode_busy_seconds", &decode_busy_seconds,
        "Thread-seconds all batch decodes of this process have spent decoding samples (pool utilisation).");
  m.def("default_num_threads", &default_num_threads);
  m.def(
      "cpu_share",
      [] {
        const CpuShare s = cpu_share();
        return dict_of<int>({{"threads", s.threads}, {"affinity", s.affinity}, {"online", s.online},
                             {"local_world_size", s.local_world_size}});
      },
      "This process's share of the cores (thread_pool.h): threads, affinity, online, local_world_size.");
  m.attr("MAX_THREADS") = kMaxThreads;
  m.def(
      "cpu_capability",
      [] { return py::make_tuple(cpu_level_name(cpu_level()), cpu_level_name(cpu_level_supported())); },
      "(in force, the CPU's widest): the instruction set level the CPU kernels run at (multiversion.h).");
  m.def(
      "set_cpu_capability",
      [](const std::string& name) { return std::string(cpu_level_name(set_cpu_level(cpu_level_named(name)))); },
      py::arg("name"), "Caps the CPU kernels' level (never above the CPU's); returns the level in force.");
  m.def(
      "_dispatch_level", [] { return cpu_level_name(dispatch_level()); },
      "The level a dispatched kernel is built for now (tests: the wider paths do run).");
  m.def("pool_threads", &pool_threads, "Worker threads alive in this process's decode pool.");
  m.def(
      "_pool_selftest",
      [](int num_threads, size_t n, int64_t throw_at) {
        ReleasedGil released;
        return pool_selftest(num_threads, n, throw_at);
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
    return py::make_tuple(l.max_pixels, l.max_scans, l.max_memory, l.max_file_size, l.max_batch_bytes);
  });
  m.def(
      "set_limits",
      [](uint64_t max_pixels, int max_scans, uint64_t max_memory, uint64_t max_file_size, uint64_t max_batch_bytes) {
        set_limits(Limits{max_pixels, max_scans, max_memory, max_file_size, max_batch_bytes});
      },
      py::arg("max_pixels"), py::arg("max_scans"), py::arg("max_memory"), py::arg("max_file_size"),
      py::arg("max_batch_bytes"));
  m.attr("libjpeg_turbo_version") = libjpeg_turbo_version();
  // libjpeg's message formats, so that libjpeg text printed by another library (DALI's bundled
  // libjpeg-turbo) can be recognised and kept off stderr
  m.attr("LIBJPEG_MESSAGES") = py::tuple(py::cast(libjpeg_message_formats()));
  m.attr("jpeg_lib_version") = jpeg_lib_version();
}

}  // namespace gpupipe
