// Decodes a batch of crops on a thread pool, each straight into its slot of one NHWC buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "decode/jpeg_decoder.h"
#include "common/thread_pool.h"

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

// A batch's statuses as the bindings return them: the samples that failed, and the warnings
// (index, message) of those that decoded.
struct BatchReport {
  std::vector<IndexedError> errors;
  std::vector<std::pair<size_t, std::string>> warnings;
};
BatchReport batch_report(const std::vector<SampleStatus>& status);

// The calling thread's Decoder::decode, with the process's entropy index (entropy_index.h): the row
// starts known for these bytes used, those reached learned (from a decode without warnings).
DecodeResult decode_indexed(const uint8_t* data, size_t size, DecodeRequest req, uint8_t* out, size_t out_stride);

// Bytes of one output slot (out_height x out_width x channels), or InvalidArgument when the
// output size is not positive or the product does not fit in size_t.
size_t slot_bytes(const DecodeRequest& request);

// Thread-seconds every decode_batch of this process has spent decoding samples: over a stretch of
// wall time and a pool's threads, its utilisation.
double decode_busy_seconds();

// Decodes sample i into out + i * slot_bytes(options.request). A failed sample's slot is
// zero-filled, never left half-written. pool == nullptr decodes on the calling thread. busy_seconds,
// when given, receives the thread-seconds spent on the batch's samples.
std::vector<SampleStatus> decode_batch(ThreadPool* pool, const std::vector<BatchSample>& samples,
                                       const BatchOptions& options, uint8_t* out, double* busy_seconds = nullptr);

// A batch decode started on a pool and not yet waited for. The Loader starts the next batch before
// it waits for this one, so the pool's threads go from one batch's last samples to the next's first
// instead of idling while the slowest sample of a batch finishes.
class PendingBatch {
 public:
  // Starts decoding `samples` (whose bytes, and `out`, must outlive the decode) on `pool`; `done`
  // runs on the pool's thread that finishes the batch.
  PendingBatch(std::shared_ptr<ThreadPool> pool, std::vector<BatchSample> samples, const BatchOptions& options,
               uint8_t* out, std::function<void()> done);
  PendingBatch(const PendingBatch&) = delete;
  PendingBatch& operator=(const PendingBatch&) = delete;
  ~PendingBatch();  // waits for the decode when nobody did

  // Every sample's status, once all are decoded (the first wait returns them; later ones too).
  const std::vector<SampleStatus>& wait();

  // Thread-seconds the pool has spent on this batch's samples (all of them once wait() returned).
  double busy_seconds() const;

  struct Job;

 private:
  std::shared_ptr<ThreadPool> pool_;
  std::shared_ptr<Job> job_;
  std::shared_ptr<ThreadPool::Loop> loop_;
  bool waited_ = false;
};

}  // namespace gpupipe
