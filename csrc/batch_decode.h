// Decodes a batch of crops on a thread pool, each straight into its slot of one NHWC buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "errors.h"
#include "jpeg_decoder.h"
#include "thread_pool.h"

namespace gpupipe {

struct BatchSample {
  const uint8_t* data = nullptr;
  size_t size = 0;
  Box box;
};

struct BatchOptions {
  DecodeRequest request;  // what every sample shares (output size, resize, mode, ...); box ignored
};

struct SampleStatus {
  ErrorKind error = ErrorKind::kNone;
  std::string message;  // the error, or the first libjpeg warning of a sample that decoded
};

// Bytes of one output slot (out_height x out_width x channels), or InvalidArgument when the
// output size is not positive or the product does not fit in size_t.
size_t slot_bytes(const DecodeRequest& request);

// Decodes sample i into out + i * slot_bytes(options.request). A failed sample's slot is
// zero-filled, never left half-written. pool == nullptr decodes on the calling thread.
std::vector<SampleStatus> decode_batch(ThreadPool* pool, const std::vector<BatchSample>& samples,
                                       const BatchOptions& options, uint8_t* out);

}  // namespace gpupipe
