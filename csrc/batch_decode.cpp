#include "batch_decode.h"

#include <cstring>
#include <limits>
#include <new>

namespace gpupipe {

size_t slot_bytes(const DecodeRequest& r) {
  if (r.out_height < 1 || r.out_width < 1) throw InvalidArgument("output size must be >= 1");
  size_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(r.out_height), static_cast<size_t>(r.out_width), &bytes) ||
      __builtin_mul_overflow(bytes, static_cast<size_t>(channels_of(r.mode)), &bytes))
    throw InvalidArgument("output size " + std::to_string(r.out_height) + "x" + std::to_string(r.out_width) +
                          " is too large");
  return bytes;
}

std::vector<SampleStatus> decode_batch(ThreadPool* pool, const std::vector<BatchSample>& samples,
                                       const BatchOptions& options, uint8_t* out) {
  const size_t slot = slot_bytes(options.request);
  size_t total = 0;
  if (__builtin_mul_overflow(slot, samples.size(), &total)) throw InvalidArgument("batch output is too large");
  const size_t row_bytes = static_cast<size_t>(options.request.out_width) * channels_of(options.request.mode);
  std::vector<SampleStatus> status(samples.size());

  auto decode_one = [&](size_t i) {
    const BatchSample& sample = samples[i];
    uint8_t* dst = out + i * slot;
    DecodeRequest req = options.request;
    req.box = sample.box;
    SampleStatus& st = status[i];
    try {
      DecodeResult r = thread_decoder().decode(sample.data, sample.size, req, dst, row_bytes);
      st.message = std::move(r.warning);
      return;
    } catch (const InvalidArgument& e) {
      st.error = ErrorKind::kInvalidArgument;
      st.message = e.what();
    } catch (const DecodeError& e) {
      st.error = e.kind;
      st.message = e.what();
    } catch (const std::bad_alloc&) {  // the machine's memory, not a limit of gpupipe's
      st.error = ErrorKind::kInternal;
      st.message = "out of memory while decoding";
    } catch (const std::exception& e) {
      st.error = ErrorKind::kInternal;
      st.message = std::string("internal error: ") + e.what();
    } catch (...) {
      st.error = ErrorKind::kInternal;
      st.message = "internal error: unknown exception";
    }
    std::memset(dst, 0, slot);
  };

  if (pool == nullptr || pool->size() <= 1 || samples.size() <= 1) {
    for (size_t i = 0; i < samples.size(); ++i) decode_one(i);
  } else {
    pool->parallel_for(samples.size(), decode_one);
  }
  return status;
}

}  // namespace gpupipe
