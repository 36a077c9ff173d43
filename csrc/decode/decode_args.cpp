#include "decode/decode_args.h"

#include <cstring>

#include "common/errors.h"
#include "common/thread_pool.h"

namespace gpupipe {
namespace {

bool overlaps(const uint8_t* a, size_t an, const uint8_t* b, size_t bn) {
  return an && bn && a < b + bn && b < a + an;
}

// The struct-module formats of int64 and float64 elements (native or little-endian).
bool int64_format(size_t itemsize, const std::string& f) {
  return itemsize == 8 && (f == "q" || f == "l" || f == "<q" || f == "<l" || f == "=q" || f == "=l");
}
bool float64_format(size_t itemsize, const std::string& f) {
  return itemsize == 8 && (f == "d" || f == "<d" || f == "=d");
}

}  // namespace

size_t checked_mul(size_t a, size_t b, const char* what) {
  size_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) throw InvalidArgument(std::string(what) + " is too large");
  return r;
}

uint8_t* checked_output(uintptr_t address, size_t needed, size_t given, const std::vector<ByteSpan>& inputs) {
  if (address == 0 && needed > 0) throw InvalidArgument("output address is null");
  if (given < needed)
    throw InvalidArgument("output buffer holds " + std::to_string(given) + " bytes, " + std::to_string(needed) +
                          " needed");
  uint8_t* out = reinterpret_cast<uint8_t*>(address);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (overlaps(out, needed, inputs[i].data, inputs[i].size))
      throw InvalidArgument("the output buffer overlaps input " + std::to_string(i) + ": decode into separate memory");
  return out;
}

ColorMode to_mode(int mode) {
  if (mode != 0 && mode != 1) throw InvalidArgument("mode must be 0 (rgb) or 1 (gray)");
  return static_cast<ColorMode>(mode);
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

CropOutput crop_output(const DecodeRequest& request, const ByteSpan& input, uintptr_t address, size_t given) {
  const size_t needed = request.out_height > 0 && request.out_width > 0 ? slot_bytes(request) : 0;
  CropOutput o;
  o.out = checked_output(address, needed, given, {input});
  o.row = static_cast<size_t>(request.out_width) * channels_of(request.mode);
  return o;
}

std::vector<Box> read_boxes(const uint8_t* data, size_t size, size_t itemsize, const std::string& format, size_t n) {
  const bool is_int = int64_format(itemsize, format);
  const bool is_float = float64_format(itemsize, format);
  if ((!is_int && !is_float) || size != checked_mul(n, 32, "boxes"))
    throw InvalidArgument("boxes must be a C-contiguous int64 or float64 array of shape [" + std::to_string(n) +
                          ", 4]");
  std::vector<Box> out(n);
  for (size_t i = 0; i < n; ++i) {
    double b[4];
    for (int k = 0; k < 4; ++k) {
      if (is_int) {
        int64_t x;
        std::memcpy(&x, data + 8 * (4 * i + k), 8);
        b[k] = static_cast<double>(x);
      } else {
        std::memcpy(&b[k], data + 8 * (4 * i + k), 8);
      }
    }
    out[i] = Box{b[0], b[1], b[2], b[3]};
  }
  return out;
}

std::vector<int64_t> read_int64s(const uint8_t* data, size_t size, size_t itemsize, const std::string& format,
                                 size_t count, const std::string& what) {
  if (!int64_format(itemsize, format) || size != checked_mul(count, 8, what.c_str()))
    throw InvalidArgument(what + " must be a C-contiguous int64 array of " + std::to_string(count) + " values");
  std::vector<int64_t> out(count);
  if (count) std::memcpy(out.data(), data, 8 * count);
  return out;
}

BatchArgs batch_args(const std::vector<ByteSpan>& inputs, const std::vector<Box>& boxes, const DecodeRequest& request,
                     int num_threads, uintptr_t address, size_t given) {
  const size_t n = inputs.size();
  if (boxes.size() != n)  // two lengths of the caller's sequences: one may have changed between the reads
    throw InvalidArgument(std::to_string(n) + " inputs but " + std::to_string(boxes.size()) + " boxes");
  BatchArgs a;
  a.samples.resize(n);
  for (size_t i = 0; i < n; ++i) {
    a.samples[i].data = inputs[i].data;
    a.samples[i].size = inputs[i].size;
    a.samples[i].box = boxes[i];
  }
  a.options.request = request;
  if (num_threads < 0 || num_threads > kMaxThreads)
    throw InvalidArgument("num_threads must be within 1.." + std::to_string(kMaxThreads) + " (0: default), got " +
                          std::to_string(num_threads));
  a.out = checked_output(address, checked_mul(slot_bytes(request), n, "the batch output"), given, inputs);
  return a;
}

}  // namespace gpupipe
