#include "batch_decode.h"

#include <cstring>
#include <new>

#include "errors.h"

namespace gpupipe {

std::vector<SampleStatus> decode_batch(ThreadPool* pool, const std::vector<BatchSample>& samples,
                                       const BatchOptions& options, uint8_t* out) {
  const size_t row_bytes = static_cast<size_t>(options.out_width) * channels_of(options.mode);
  const size_t slot_bytes = row_bytes * options.out_height;
  std::vector<SampleStatus> status(samples.size());

  auto decode_one = [&](size_t i) {
    const BatchSample& sample = samples[i];
    uint8_t* slot = out + i * slot_bytes;
    DecodeRequest req;
    req.box = sample.box;
    req.out_height = options.out_height;
    req.out_width = options.out_width;
    req.resize = options.resize;
    req.dct_scaling = options.dct_scaling;
    req.mode = options.mode;
    req.strict = options.strict;
    SampleStatus& st = status[i];
    try {
      DecodeResult r = thread_decoder().decode(sample.data, sample.size, req, slot, row_bytes);
      st.message = std::move(r.warning);
      return;
    } catch (const InvalidArgument& e) {
      st.error = SampleError::kInvalidArgument;
      st.message = e.what();
    } catch (const TooLarge& e) {
      st.error = SampleError::kTooLarge;
      st.message = e.what();
    } catch (const DecodeError& e) {
      st.error = SampleError::kDecode;
      st.message = e.what();
    } catch (const std::bad_alloc&) {
      st.error = SampleError::kInternal;
      st.message = "out of memory";
    } catch (const std::exception& e) {
      st.error = SampleError::kInternal;
      st.message = std::string("internal error: ") + e.what();
    }
    std::memset(slot, 0, slot_bytes);
  };

  if (pool == nullptr || pool->size() <= 1 || samples.size() <= 1) {
    for (size_t i = 0; i < samples.size(); ++i) decode_one(i);
  } else {
    pool->parallel_for(samples.size(), decode_one);
  }
  return status;
}

}  // namespace gpupipe
