#include "decode/batch_decode.h"

#include "decode/entropy_index.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <new>

namespace gpupipe {

BatchReport batch_report(const std::vector<SampleStatus>& status) {
  BatchReport r;
  for (size_t i = 0; i < status.size(); ++i) {
    const SampleStatus& s = status[i];
    if (s.error != ErrorKind::kNone)
      r.errors.emplace_back(i, s.error, s.message);
    else if (!s.message.empty())
      r.warnings.emplace_back(i, s.message);
  }
  return r;
}

size_t slot_bytes(const DecodeRequest& r) {
  if (r.out_height < 1 || r.out_width < 1) throw InvalidArgument("output size must be >= 1");
  size_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(r.out_height), static_cast<size_t>(r.out_width), &bytes) ||
      __builtin_mul_overflow(bytes, static_cast<size_t>(channels_of(r.mode)), &bytes))
    throw InvalidArgument("output size " + std::to_string(r.out_height) + "x" + std::to_string(r.out_width) +
                          " is too large");
  return bytes;
}

DecodeResult decode_indexed(const uint8_t* data, size_t size, DecodeRequest req, uint8_t* out, size_t out_stride) {
  EntropyIndexUse entropy;  // the rows known for these bytes (looked up by the reader), and those this decode learns
  if (entropy_index_enabled() && data != nullptr) {
    entropy.data = data;
    entropy.size = size;
    req.entropy = &entropy;
  }
  DecodeResult r = thread_decoder().decode(data, size, req, out, out_stride);
  if (r.warning.empty()) learn_entropy_rows(std::move(entropy));  // (warned: not learned from)
  return r;
}

namespace {
std::atomic<uint64_t> g_decode_busy_ns{0};
}

double decode_busy_seconds() { return static_cast<double>(g_decode_busy_ns.load(std::memory_order_relaxed)) * 1e-9; }

// One batch: its samples, where they go, and how each ended.
struct PendingBatch::Job {
  std::vector<BatchSample> samples;
  BatchOptions options;
  uint8_t* out = nullptr;
  size_t slot = 0, row_bytes = 0;
  std::vector<SampleStatus> status;
  std::atomic<uint64_t> busy_ns{0};  // this batch's share of g_decode_busy_ns (the hybrid backend's re-tuning)

  Job(std::vector<BatchSample> s, const BatchOptions& o, uint8_t* dst) : samples(std::move(s)), options(o), out(dst) {
    slot = slot_bytes(options.request);
    size_t total = 0;
    if (__builtin_mul_overflow(slot, samples.size(), &total)) throw InvalidArgument("batch output is too large");
    row_bytes = static_cast<size_t>(options.request.out_width) * channels_of(options.request.mode);
    status.resize(samples.size());
  }

  void decode_one(size_t i);
};

void PendingBatch::Job::decode_one(size_t i) {
  const auto start = std::chrono::steady_clock::now();
  struct Busy {  // counted however the sample ends
    std::chrono::steady_clock::time_point start;
    std::atomic<uint64_t>& batch_ns;
    ~Busy() {
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);
      g_decode_busy_ns.fetch_add(static_cast<uint64_t>(ns.count()), std::memory_order_relaxed);
      batch_ns.fetch_add(static_cast<uint64_t>(ns.count()), std::memory_order_relaxed);
    }
  } busy{start, busy_ns};
  const BatchSample& sample = samples[i];
  uint8_t* dst = out + i * slot;
  DecodeRequest req = options.request;
  req.box = sample.box;
  SampleStatus& st = status[i];
  try {
    DecodeResult r = decode_indexed(sample.data, sample.size, req, dst, row_bytes);
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
}

std::vector<SampleStatus> decode_batch(ThreadPool* pool, const std::vector<BatchSample>& samples,
                                       const BatchOptions& options, uint8_t* out, double* busy_seconds) {
  PendingBatch::Job job(samples, options, out);
  if (pool == nullptr || pool->size() <= 1 || samples.size() <= 1) {
    for (size_t i = 0; i < samples.size(); ++i) job.decode_one(i);
  } else {
    pool->parallel_for(samples.size(), [&job](size_t i) { job.decode_one(i); });
  }
  if (busy_seconds != nullptr) *busy_seconds = static_cast<double>(job.busy_ns.load()) * 1e-9;
  return std::move(job.status);
}

PendingBatch::PendingBatch(std::shared_ptr<ThreadPool> pool, std::vector<BatchSample> samples,
                           const BatchOptions& options, uint8_t* out, std::function<void()> done)
    : pool_(std::move(pool)), job_(std::make_shared<Job>(std::move(samples), options, out)) {
  std::shared_ptr<Job> job = job_;  // the loop's own reference: a worker may still run it after a wait throws
  loop_ = pool_->start(job->samples.size(), [job](size_t i) { job->decode_one(i); }, std::move(done));
}

PendingBatch::~PendingBatch() {
  if (!waited_) ThreadPool::wait_quietly(loop_);
}

const std::vector<SampleStatus>& PendingBatch::wait() {
  if (!waited_) {
    waited_ = true;
    ThreadPool::wait(loop_);  // decode_one catches everything: nothing is rethrown
  }
  return job_->status;
}

double PendingBatch::busy_seconds() const {
  return static_cast<double>(job_->busy_ns.load(std::memory_order_relaxed)) * 1e-9;
}

}  // namespace gpupipe
