// The decode entry points' arguments as a binding receives them (plain numbers, the inputs' bytes,
// the output as an address and a size), checked and turned into the core's requests before the GIL
// is released and before any decode starts; a failure is an InvalidArgument (ValueError in Python)
// saying what is wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "decode/batch_decode.h"
#include "decode/jpeg_decoder.h"

namespace gpupipe {

// The bytes of one input (held by the caller for the call).
struct ByteSpan {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

// a * b; InvalidArgument "<what> is too large" when it overflows.
size_t checked_mul(size_t a, size_t b, const char* what);

// The caller's output at `address` (a tensor's data_ptr()) of `given` bytes, checked to hold `needed`
// bytes and to share no byte with any input.
uint8_t* checked_output(uintptr_t address, size_t needed, size_t given, const std::vector<ByteSpan>& inputs);

// 0 (rgb) or 1 (gray).
ColorMode to_mode(int mode);

// What every sample of a call shares: output size, resize, mode, strictness, DCT scaling, window.
DecodeRequest make_request(int out_height, int out_width, bool resize, int mode, bool strict, bool dct_scaling,
                           bool window);

// Where decode_into writes `request`'s crop of `input`: the output, checked to hold out_height x
// out_width x C uint8, and its row length. A size that is not positive is left to the decoder, which
// reports it after the box (the more useful message).
struct CropOutput {
  uint8_t* out = nullptr;
  size_t row = 0;  // bytes
};
CropOutput crop_output(const DecodeRequest& request, const ByteSpan& input, uintptr_t address, size_t given);

// The boxes of a batch from a C-contiguous [n, 4] buffer of int64 or float64 (its element size and
// struct-module format as the buffer protocol gives them), read without assuming alignment.
std::vector<Box> read_boxes(const uint8_t* data, size_t size, size_t itemsize, const std::string& format, size_t n);

// `count` values of a C-contiguous int64 buffer, read the same way; InvalidArgument naming `what`
// (e.g. "slots, shape [3],") otherwise.
std::vector<int64_t> read_int64s(const uint8_t* data, size_t size, size_t itemsize, const std::string& format,
                                 size_t count, const std::string& what);

// A batch decode's samples, options and output, checked: num_threads within 0..kMaxThreads (0: the
// default), the output holding one slot per sample and overlapping no input.
struct BatchArgs {
  std::vector<BatchSample> samples;
  BatchOptions options;
  uint8_t* out = nullptr;
};
BatchArgs batch_args(const std::vector<ByteSpan>& inputs, const std::vector<Box>& boxes, const DecodeRequest& request,
                     int num_threads, uintptr_t address, size_t given);

}  // namespace gpupipe
