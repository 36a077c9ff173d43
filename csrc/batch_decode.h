// Decodes a batch of crops on a thread pool, each straight into its slot of one NHWC buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "jpeg_decoder.h"
#include "thread_pool.h"

namespace gpupipe {

struct BatchSample {
  const uint8_t* data = nullptr;
  size_t size = 0;
  Box box;
};

struct BatchOptions {
  int out_height = 0, out_width = 0;
  bool resize = false;
  bool dct_scaling = true;
  bool strict = false;
  ColorMode mode = ColorMode::kRGB;
};

enum class SampleError : int { kNone = 0, kInvalidArgument = 1, kDecode = 2, kTooLarge = 3, kInternal = 4 };

struct SampleStatus {
  SampleError error = SampleError::kNone;
  std::string message;  // the error, or the first libjpeg warning of a sample that decoded
};

// Decodes sample i into out + i * out_height * out_width * channels. A failed sample's slot is
// zero-filled, never left half-written. pool == nullptr decodes on the calling thread.
std::vector<SampleStatus> decode_batch(ThreadPool* pool, const std::vector<BatchSample>& samples,
                                       const BatchOptions& options, uint8_t* out);

}  // namespace gpupipe
