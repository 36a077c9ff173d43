// gpupipe._C_cuda.NvimgcodecDecoder: nvImageCodec's decoders through its C API, one GIL-free call per
// engine call. The Python API costs a CodeStream object and a __cuda_array_interface__ read per image
// (2.5-7 ms per call of about 130 images on an H100, docs/gpu.md); here the whole call (parse, check,
// decode into the caller's buffer, statuses) runs in C++ with the GIL released.
//
// The library is loaded with dlopen from the directory the Python package gives (the wheel's
// libnvimgcodec.so.0), so gpupipe links nothing of it; the header it was built with must match the
// library's major.minor (checked at load). One library instance per process, never destroyed: daemon
// engine threads may still hold it while the interpreter exits.
//
// Kinds: "hardware" (the GPU's JPEG engines), "cuda" (nvJPEG's CUDA decoder), and "cpu" (nvImageCodec's
// libjpeg-turbo extension into host memory: the same C-API path, testable without a GPU).
#include <dlfcn.h>
#include <nvimgcodec.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings/buffer_view.h"

namespace py = pybind11;

namespace gpupipe {
namespace {

// Statuses of samples that never reach the decoder (nvImageCodec's own are positive bitmasks).
constexpr int32_t kUnparsed = -1;     // nvImageCodec's parser refused the bytes
constexpr int32_t kSizeMismatch = -2;  // parsed, but not the size the caller's header table says
constexpr int32_t kNotJpeg = -3;      // parsed as another codec
constexpr int32_t kNoRegion = -4;     // the region is outside the image, or its sub code stream failed
constexpr int32_t kNoSize = -5;       // the caller's header table has no size for it (an unreadable header)
constexpr int32_t kNot8Bit = -6;      // samples of another precision than 8 bits (12-bit, lossless 16-bit)

struct Api {
  decltype(&nvimgcodecGetProperties) GetProperties = nullptr;
  decltype(&nvimgcodecInstanceCreate) InstanceCreate = nullptr;
  decltype(&nvimgcodecDecoderCreate) DecoderCreate = nullptr;
  decltype(&nvimgcodecDecoderDestroy) DecoderDestroy = nullptr;
  decltype(&nvimgcodecCodeStreamCreateFromHostMem) CodeStreamCreateFromHostMem = nullptr;
  decltype(&nvimgcodecCodeStreamGetSubCodeStream) CodeStreamGetSubCodeStream = nullptr;
  decltype(&nvimgcodecCodeStreamGetImageInfo) CodeStreamGetImageInfo = nullptr;
  decltype(&nvimgcodecCodeStreamDestroy) CodeStreamDestroy = nullptr;
  decltype(&nvimgcodecImageCreate) ImageCreate = nullptr;
  decltype(&nvimgcodecImageDestroy) ImageDestroy = nullptr;
  decltype(&nvimgcodecDecoderDecode) DecoderDecode = nullptr;
  decltype(&nvimgcodecFutureWaitForAll) FutureWaitForAll = nullptr;
  decltype(&nvimgcodecFutureGetProcessingStatus) FutureGetProcessingStatus = nullptr;
  decltype(&nvimgcodecFutureDestroy) FutureDestroy = nullptr;
  nvimgcodecInstance_t instance = nullptr;
  std::string directory;
};

template <typename F>
void bind(void* handle, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(handle, name));
  if (!fn) throw std::runtime_error(std::string("libnvimgcodec has no ") + name);
}

// The process's library and instance, loaded from `directory` once (a later different directory is an
// error: two copies of the library would not share decoders). Deliberately never freed, not even by
// static destructors at exit: a daemon engine thread may still be inside a call then.
const Api& library(const std::string& directory) {
  static std::mutex mutex;
  static Api* api = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  if (api) {
    if (api->directory != directory)
      throw std::runtime_error("nvImageCodec was loaded from " + api->directory + ", not " + directory);
    return *api;
  }
  const std::string path = directory + "/libnvimgcodec.so.0";
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) throw std::runtime_error("cannot load " + path + ": " + dlerror());
  auto a = std::make_unique<Api>();
  bind(handle, a->GetProperties, "nvimgcodecGetProperties");
  bind(handle, a->InstanceCreate, "nvimgcodecInstanceCreate");
  bind(handle, a->DecoderCreate, "nvimgcodecDecoderCreate");
  bind(handle, a->DecoderDestroy, "nvimgcodecDecoderDestroy");
  bind(handle, a->CodeStreamCreateFromHostMem, "nvimgcodecCodeStreamCreateFromHostMem");
  bind(handle, a->CodeStreamGetSubCodeStream, "nvimgcodecCodeStreamGetSubCodeStream");
  bind(handle, a->CodeStreamGetImageInfo, "nvimgcodecCodeStreamGetImageInfo");
  bind(handle, a->CodeStreamDestroy, "nvimgcodecCodeStreamDestroy");
  bind(handle, a->ImageCreate, "nvimgcodecImageCreate");
  bind(handle, a->ImageDestroy, "nvimgcodecImageDestroy");
  bind(handle, a->DecoderDecode, "nvimgcodecDecoderDecode");
  bind(handle, a->FutureWaitForAll, "nvimgcodecFutureWaitForAll");
  bind(handle, a->FutureGetProcessingStatus, "nvimgcodecFutureGetProcessingStatus");
  bind(handle, a->FutureDestroy, "nvimgcodecFutureDestroy");
  nvimgcodecProperties_t props{NVIMGCODEC_STRUCTURE_TYPE_PROPERTIES, sizeof(nvimgcodecProperties_t), nullptr};
  if (a->GetProperties(&props) != NVIMGCODEC_STATUS_SUCCESS)
    throw std::runtime_error("nvimgcodecGetProperties failed");
  const uint32_t major = NVIMGCODEC_MAJOR_FROM_SEMVER(props.version), minor = NVIMGCODEC_MINOR_FROM_SEMVER(props.version);
  if (major != NVIMGCODEC_VER_MAJOR || minor != NVIMGCODEC_VER_MINOR)
    throw std::runtime_error("libnvimgcodec is version " + std::to_string(major) + "." + std::to_string(minor) +
                             ", gpupipe was built with " + std::to_string(NVIMGCODEC_VER_MAJOR) + "." +
                             std::to_string(NVIMGCODEC_VER_MINOR) + "'s header: rebuild gpupipe");
  nvimgcodecInstanceCreateInfo_t info{NVIMGCODEC_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                                      sizeof(nvimgcodecInstanceCreateInfo_t), nullptr};
  const std::string extensions = directory + "/extensions";
  info.load_builtin_modules = 1;
  info.load_extension_modules = 1;
  info.extension_modules_path = extensions.c_str();
  info.create_debug_messenger = 0;  // no log lines: what a sample's decode says is its status
  if (a->InstanceCreate(&a->instance, &info) != NVIMGCODEC_STATUS_SUCCESS || !a->instance)
    throw std::runtime_error("nvimgcodecInstanceCreate failed");
  a->directory = directory;
  api = a.release();
  return *api;
}

// Handles destroyed on scope exit.
struct Handles {
  const Api* api;
  std::vector<nvimgcodecCodeStream_t> streams;  // parsed, one per sample (null where refused)
  std::vector<nvimgcodecCodeStream_t> regions;  // sub code streams (ROI), where asked for
  std::vector<nvimgcodecImage_t> images;
  ~Handles() {
    for (auto h : images) if (h) api->ImageDestroy(h);
    for (auto h : regions) if (h) api->CodeStreamDestroy(h);
    for (auto h : streams) if (h) api->CodeStreamDestroy(h);
  }
};

class NvimgcodecDecoder {
 public:
  NvimgcodecDecoder(const std::string& directory, const std::string& kind, int device_id, int cpu_threads,
                    const std::string& options)
      : api_(&library(directory)),
        buffer_kind_(kind == "cpu" ? NVIMGCODEC_IMAGE_BUFFER_KIND_STRIDED_HOST : NVIMGCODEC_IMAGE_BUFFER_KIND_STRIDED_DEVICE) {
    std::vector<nvimgcodecBackend_t> backends;
    auto add = [&](nvimgcodecBackendKind_t k) {
      nvimgcodecBackend_t b{NVIMGCODEC_STRUCTURE_TYPE_BACKEND, sizeof(nvimgcodecBackend_t), nullptr};
      b.kind = k;
      b.params = {NVIMGCODEC_STRUCTURE_TYPE_BACKEND_PARAMS, sizeof(nvimgcodecBackendParams_t), nullptr};
      b.params.load_hint = 1.0f;
      b.params.load_hint_policy = NVIMGCODEC_LOAD_HINT_POLICY_FIXED;
      backends.push_back(b);
    };
    if (kind == "hardware") {
      add(NVIMGCODEC_BACKEND_KIND_HW_GPU_ONLY);
    } else if (kind == "cuda") {  // nvjpeg_cuda_decoder registers as HYBRID_CPU_GPU; GPU_ONLY in case it moves
      add(NVIMGCODEC_BACKEND_KIND_GPU_ONLY);
      add(NVIMGCODEC_BACKEND_KIND_HYBRID_CPU_GPU);
    } else if (kind == "cpu") {
      add(NVIMGCODEC_BACKEND_KIND_CPU_ONLY);
      device_id = NVIMGCODEC_DEVICE_CPU_ONLY;
    } else {
      throw std::invalid_argument("kind must be 'hardware', 'cuda' or 'cpu', got '" + kind + "'");
    }
    if (cpu_threads < 1) throw std::invalid_argument("cpu_threads must be >= 1");
    nvimgcodecExecutionParams_t exec{NVIMGCODEC_STRUCTURE_TYPE_EXECUTION_PARAMS, sizeof(nvimgcodecExecutionParams_t),
                                     nullptr};
    exec.device_id = device_id;
    exec.max_num_cpu_threads = cpu_threads;
    exec.num_backends = static_cast<int>(backends.size());
    exec.backends = backends.data();
    const nvimgcodecStatus_t status = api_->DecoderCreate(api_->instance, &decoder_, &exec, options.c_str());
    if (status != NVIMGCODEC_STATUS_SUCCESS || !decoder_)
      throw std::runtime_error("nvimgcodecDecoderCreate failed (status " + std::to_string(status) + ")");
  }
  ~NvimgcodecDecoder() {
    if (decoder_) api_->DecoderDestroy(decoder_);
  }
  NvimgcodecDecoder(const NvimgcodecDecoder&) = delete;
  NvimgcodecDecoder& operator=(const NvimgcodecDecoder&) = delete;

  // Decodes sample k (its region [top, left, bottom, right) when `regions` is given) into `channels`
  // interleaved uint8 channels (3: sRGB, 1: gray) at out_address + offsets[k], rows packed; returns a
  // status per sample: 1 decoded, nvImageCodec's processing status where it declined, or < 0 for a sample
  // not given to it (unparsed, another size than `sizes` [N, 2] (height, width), not a JPEG, no region,
  // no size, not 8-bit). The outputs of the samples given must not overlap (std::invalid_argument).
  py::array_t<int32_t> decode(py::sequence buffers, py::array_t<int64_t, py::array::c_style> sizes,
                              py::object regions_arg, int channels, uintptr_t out_address, uint64_t out_nbytes,
                              py::array_t<int64_t, py::array::c_style> offsets, uintptr_t stream) {
    if (channels != 1 && channels != 3) throw std::invalid_argument("channels must be 1 or 3");
    std::vector<BufferView> views = buffer_views(buffers);
    const size_t n = views.size();
    if (sizes.ndim() != 2 || static_cast<size_t>(sizes.shape(0)) != n || sizes.shape(1) != 2)
      throw std::invalid_argument("sizes must be int64 [N, 2] (height, width), one row per buffer");
    if (offsets.ndim() != 1 || static_cast<size_t>(offsets.shape(0)) != n)
      throw std::invalid_argument("offsets must be int64 [N], one per buffer");
    const int64_t* region = nullptr;
    py::array_t<int64_t, py::array::c_style | py::array::forcecast> regions;
    if (!regions_arg.is_none()) {
      regions = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(regions_arg);
      if (!regions || regions.ndim() != 2 || static_cast<size_t>(regions.shape(0)) != n || regions.shape(1) != 4)
        throw std::invalid_argument("regions must be int64 [N, 4] (top, left, bottom, right) or None");
      region = regions.data();
    }
    // Copies of the tables: the GIL-free part reads these, never the caller's arrays (which another
    // thread could change after the checks). The buffers' bytes must not change during the call.
    const std::vector<int64_t> size_copy(sizes.data(), sizes.data() + 2 * n);
    const std::vector<int64_t> offset_copy(offsets.data(), offsets.data() + n);
    std::vector<int64_t> region_copy;
    if (region) region_copy.assign(region, region + 4 * n);
    region = region ? region_copy.data() : nullptr;
    const int64_t* size = size_copy.data();
    const int64_t* offset = offset_copy.data();
    // Every sample's output inside [out_address, out_address + out_nbytes): checked before any decode.
    // A sample without a valid size or region is declined before the decoder sees it (status < 0).
    std::vector<int64_t> out_h(n, 0), out_w(n, 0);
    py::array_t<int32_t> statuses(static_cast<py::ssize_t>(n));
    int32_t* status = statuses.mutable_data();
    for (size_t k = 0; k < n; ++k) {
      const int64_t h = size[2 * k], w = size[2 * k + 1];
      status[k] = 0;
      if (h <= 0 || w <= 0 || h > 65535 || w > 65535) {
        status[k] = kNoSize;
        continue;
      }
      int64_t oh = h, ow = w;
      if (region) {
        const int64_t* r = region + 4 * k;
        if (r[0] < 0 || r[1] < 0 || r[2] > h || r[3] > w || r[2] <= r[0] || r[3] <= r[1]) {
          status[k] = kNoRegion;
          continue;
        }
        oh = r[2] - r[0];
        ow = r[3] - r[1];
      }
      const uint64_t bytes = static_cast<uint64_t>(oh) * static_cast<uint64_t>(ow) * static_cast<uint64_t>(channels);
      if (offset[k] < 0 || static_cast<uint64_t>(offset[k]) > out_nbytes || bytes > out_nbytes - offset[k])
        throw std::invalid_argument("sample " + std::to_string(k) + "'s output is outside the out buffer");
      out_h[k] = oh;
      out_w[k] = ow;
    }
    // No two samples' outputs overlap (a decoder writes a whole slot; overlapping slots would hand one
    // sample another's pixels without a decline).
    std::vector<size_t> order;
    for (size_t k = 0; k < n; ++k) if (status[k] == 0) order.push_back(k);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return offset[a] < offset[b]; });
    for (size_t i = 1; i < order.size(); ++i) {
      const size_t a = order[i - 1], b = order[i];
      if (offset[a] + out_h[a] * out_w[a] * channels > offset[b])
        throw std::invalid_argument("samples " + std::to_string(a) + " and " + std::to_string(b) +
                                    " have overlapping outputs");
    }
    if (n && out_address == 0) throw std::invalid_argument("the out address is null");
    std::string error;
    {
      py::gil_scoped_release released;
      std::lock_guard<std::mutex> lock(mutex_);  // one call at a time per decoder
      error = run(views, size, region, channels, out_address, offset, out_h, out_w, stream, status);
    }
    if (!error.empty()) throw std::runtime_error(error);
    return statuses;
  }

 private:
  // The GIL-free part: parse and check each sample, one decode call for those that pass, statuses.
  // Returns an error message for a failure of the whole call (the batch fails), "" otherwise.
  std::string run(const std::vector<BufferView>& views, const int64_t* size, const int64_t* region, int channels,
                  uintptr_t out_address, const int64_t* offset, const std::vector<int64_t>& out_h,
                  const std::vector<int64_t>& out_w, uintptr_t stream, int32_t* status) {
    const size_t n = views.size();
    Handles h{api_, std::vector<nvimgcodecCodeStream_t>(n, nullptr), std::vector<nvimgcodecCodeStream_t>(n, nullptr),
              {}};
    std::vector<nvimgcodecCodeStream_t> to_decode;
    std::vector<size_t> sample;  // to_decode[i] is sample[i]
    h.images.reserve(n);
    for (size_t k = 0; k < n; ++k) {
      if (status[k] < 0) continue;  // no size or region: declined by decode()
      nvimgcodecImageInfo_t info{NVIMGCODEC_STRUCTURE_TYPE_IMAGE_INFO, sizeof(nvimgcodecImageInfo_t), nullptr};
      if (views[k].size() == 0 ||
          api_->CodeStreamCreateFromHostMem(api_->instance, &h.streams[k], views[k].data(), views[k].size(),
                                            nullptr) != NVIMGCODEC_STATUS_SUCCESS ||
          !h.streams[k] || api_->CodeStreamGetImageInfo(h.streams[k], &info) != NVIMGCODEC_STATUS_SUCCESS) {
        status[k] = kUnparsed;
        continue;
      }
      info.codec_name[NVIMGCODEC_MAX_CODEC_NAME_SIZE - 1] = '\0';
      if (std::strcmp(info.codec_name, "jpeg") != 0) {
        status[k] = kNotJpeg;
        continue;
      }
      if (info.num_planes < 1 || info.plane_info[0].height != size[2 * k] || info.plane_info[0].width != size[2 * k + 1]) {
        status[k] = kSizeMismatch;
        continue;
      }
      const uint8_t precision = info.plane_info[0].precision;
      if (info.plane_info[0].sample_type != NVIMGCODEC_SAMPLE_DATA_TYPE_UINT8 || (precision != 0 && precision != 8)) {
        status[k] = kNot8Bit;
        continue;
      }
      nvimgcodecCodeStream_t source = h.streams[k];
      if (region) {
        const int64_t* r = region + 4 * k;
        nvimgcodecCodeStreamView_t view{NVIMGCODEC_STRUCTURE_TYPE_CODE_STREAM_VIEW, sizeof(nvimgcodecCodeStreamView_t),
                                        nullptr};
        view.image_idx = 0;
        view.region = {NVIMGCODEC_STRUCTURE_TYPE_REGION, sizeof(nvimgcodecRegion_t), nullptr};
        view.region.ndim = 2;
        view.region.start[0] = static_cast<int>(r[0]);
        view.region.start[1] = static_cast<int>(r[1]);
        view.region.end[0] = static_cast<int>(r[2]);
        view.region.end[1] = static_cast<int>(r[3]);
        if (api_->CodeStreamGetSubCodeStream(h.streams[k], &h.regions[k], &view) != NVIMGCODEC_STATUS_SUCCESS ||
            !h.regions[k]) {
          status[k] = kNoRegion;
          continue;
        }
        source = h.regions[k];
      }
      nvimgcodecImageInfo_t out{NVIMGCODEC_STRUCTURE_TYPE_IMAGE_INFO, sizeof(nvimgcodecImageInfo_t), nullptr};
      out.color_spec = channels == 3 ? NVIMGCODEC_COLORSPEC_SRGB : NVIMGCODEC_COLORSPEC_GRAY;
      out.chroma_subsampling = NVIMGCODEC_SAMPLING_NONE;
      out.sample_format = channels == 3 ? NVIMGCODEC_SAMPLEFORMAT_I_RGB : NVIMGCODEC_SAMPLEFORMAT_P_Y;
      out.orientation = {NVIMGCODEC_STRUCTURE_TYPE_ORIENTATION, sizeof(nvimgcodecOrientation_t), nullptr, 0, 0, 0};
      out.num_planes = 1;
      nvimgcodecImagePlaneInfo_t& plane = out.plane_info[0];
      plane = {NVIMGCODEC_STRUCTURE_TYPE_IMAGE_PLANE_INFO, sizeof(nvimgcodecImagePlaneInfo_t), nullptr};
      plane.height = static_cast<uint32_t>(out_h[k]);
      plane.width = static_cast<uint32_t>(out_w[k]);
      plane.row_stride = static_cast<size_t>(out_w[k]) * channels;
      plane.num_channels = static_cast<uint32_t>(channels);
      plane.sample_type = NVIMGCODEC_SAMPLE_DATA_TYPE_UINT8;
      plane.precision = 0;
      out.buffer = reinterpret_cast<void*>(out_address + static_cast<uintptr_t>(offset[k]));
      out.buffer_kind = buffer_kind_;
      out.cuda_stream = reinterpret_cast<cudaStream_t>(stream);
      nvimgcodecImage_t image = nullptr;
      if (api_->ImageCreate(api_->instance, &image, &out) != NVIMGCODEC_STATUS_SUCCESS || !image)
        return "nvimgcodecImageCreate failed for sample " + std::to_string(k);
      h.images.push_back(image);
      to_decode.push_back(source);
      sample.push_back(k);
    }
    if (to_decode.empty()) return "";
    nvimgcodecDecodeParams_t params{NVIMGCODEC_STRUCTURE_TYPE_DECODE_PARAMS, sizeof(nvimgcodecDecodeParams_t), nullptr};
    params.apply_exif_orientation = 0;
    nvimgcodecFuture_t future = nullptr;
    const nvimgcodecStatus_t called = api_->DecoderDecode(decoder_, to_decode.data(), h.images.data(),
                                                          static_cast<int>(to_decode.size()), &params, &future);
    if (called != NVIMGCODEC_STATUS_SUCCESS || !future) {
      if (future) {
        api_->FutureWaitForAll(future);
        api_->FutureDestroy(future);
      }
      return "nvimgcodecDecoderDecode failed (status " + std::to_string(called) + ")";
    }
    const nvimgcodecStatus_t waited = api_->FutureWaitForAll(future);
    // size is in/out: the array's capacity in, the statuses written out (0.9 refuses a null array)
    std::vector<nvimgcodecProcessingStatus_t> results(to_decode.size(), NVIMGCODEC_PROCESSING_STATUS_UNKNOWN);
    size_t count = results.size();
    if (api_->FutureGetProcessingStatus(future, results.data(), &count) != NVIMGCODEC_STATUS_SUCCESS) count = 0;
    api_->FutureDestroy(future);
    if (waited != NVIMGCODEC_STATUS_SUCCESS)
      return "nvimgcodecFutureWaitForAll failed (status " + std::to_string(waited) + ")";
    if (count != results.size())
      return "nvImageCodec returned " + std::to_string(count) + " statuses for " + std::to_string(results.size()) +
             " samples";
    for (size_t i = 0; i < sample.size(); ++i) status[sample[i]] = static_cast<int32_t>(results[i]);
    return "";
  }

  const Api* api_;
  nvimgcodecImageBufferKind_t buffer_kind_;  // host memory for kind "cpu", device memory otherwise
  nvimgcodecDecoder_t decoder_ = nullptr;
  std::mutex mutex_;
};

}  // namespace

void register_nvimgcodec_engine(py::module_& m) {
  py::class_<NvimgcodecDecoder>(m, "NvimgcodecDecoder",
                                "nvImageCodec's decoder of one kind through its C API (gpupipe._backends.nvimgcodec).")
      .def(py::init<const std::string&, const std::string&, int, int, const std::string&>(), py::arg("directory"),
           py::arg("kind"), py::arg("device_id"), py::arg("cpu_threads"), py::arg("options"))
      .def("decode", &NvimgcodecDecoder::decode, py::arg("buffers"), py::arg("sizes"), py::arg("regions"),
           py::arg("channels"), py::arg("out_address"), py::arg("out_nbytes"), py::arg("offsets"), py::arg("stream"),
           "Decodes each buffer (its region when regions is given) into out_address + offsets[k], rows packed; "
           "returns int32 statuses: 1 decoded, nvImageCodec's processing status, or -1 unparsed, -2 another size "
           "than sizes, -3 not a JPEG, -4 no region, -5 no size, -6 not 8-bit. The GIL is released while it runs; "
           "the buffers must not change meanwhile.");
  m.attr("NVIMGCODEC_HEADER_VERSION") = py::make_tuple(NVIMGCODEC_VER_MAJOR, NVIMGCODEC_VER_MINOR, NVIMGCODEC_VER_PATCH);
}

}  // namespace gpupipe
