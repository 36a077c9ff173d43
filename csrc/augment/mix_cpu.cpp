#include "augment/mix_cpu.h"

#include <algorithm>
#include <vector>

#include "common/errors.h"
#include "common/multiversion.h"
#include "common/parallel_rows.h"
#include "common/strided_buffer.h"

namespace gpupipe {
namespace {

// out[k] = other[k] * a + self[k] * b. `out` may be `self` (the in-place blend), never `other`.
inline void blend(const float* __restrict__ other, const float* self, float* out, int64_t count, float a,
                  float b) {
  for (int64_t k = 0; k < count; ++k) {
    const float p = other[k] * a;  // torchvision: images.roll(1, 0).mul_(1 - lam)
    const float q = self[k] * b;   //              .add_(images.mul(lam))
    out[k] = p + q;
  }
}

constexpr int64_t kChunk = 1 << 14;  // floats per task: a few per sample, so both threads stay busy

}  // namespace

MixArgs mixup_args(const std::vector<int64_t>& images, const std::vector<int64_t>* output, double lam) {
  const StridedBuffer x = parse_buffer(images, "images", kFloat32, {-1, -1, -1, -1});
  StridedBuffer out;
  if (output) out = parse_buffer(*output, "out", kFloat32, {x.shape[0], x.shape[1], x.shape[2], x.shape[3]});
  require_contiguous(x, "images");
  if (output) {
    require_contiguous(out, "out");
    check_disjoint(out, "out", x, "images");
  }
  if (!(lam >= 0.0 && lam <= 1.0)) throw InvalidArgument("lam must be within [0, 1]");
  MixArgs a;
  a.images = x.as<float>();
  a.out = output ? out.as<float>() : nullptr;
  a.n = x.shape[0];
  a.per_sample = x.shape[1] * x.shape[2] * x.shape[3];
  a.lam = lam;
  return a;
}

void mixup_rolled_cpu(const float* x, float* out, int64_t n, int64_t per_sample, double lam, int num_threads) {
  if (n <= 0 || per_sample <= 0) return;
  // The scalars as torch applies them to a float32 tensor: 1 - lam in double, then each to float.
  const float a = static_cast<float>(1.0 - lam), b = static_cast<float>(lam);
  const int64_t per_chunks = (per_sample + kChunk - 1) / kChunk;
  parallel_rows(n * per_chunks, num_threads, [&](int64_t begin, int64_t end) {
    dispatch([&](auto) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t i = r / per_chunks, k0 = (r % per_chunks) * kChunk;
        const int64_t count = per_sample - k0 < kChunk ? per_sample - k0 : kChunk;
        const int64_t prev = i == 0 ? n - 1 : i - 1;
        blend(x + prev * per_sample + k0, x + i * per_sample + k0, out + i * per_sample + k0, count, a, b);
      }
    });
  });
}

void mixup_rolled_inplace_cpu(float* x, int64_t n, int64_t per_sample, double lam, int num_threads) {
  if (n <= 0 || per_sample <= 0) return;
  const float a = static_cast<float>(1.0 - lam), b = static_cast<float>(lam);
  const int64_t per_chunks = (per_sample + kChunk - 1) / kChunk;
  // A task owns one span of every sample: sample i takes sample i - 1's span before that one is
  // overwritten (i = n-1 down to 1), and sample 0 the copy of sample n-1's original span.
  parallel_rows(per_chunks, num_threads, [&](int64_t begin, int64_t end) {
    std::vector<float> last(static_cast<size_t>(kChunk));
    dispatch([&](auto) {
      for (int64_t c = begin; c < end; ++c) {
        const int64_t k0 = c * kChunk, count = per_sample - k0 < kChunk ? per_sample - k0 : kChunk;
        std::copy(x + (n - 1) * per_sample + k0, x + (n - 1) * per_sample + k0 + count, last.begin());
        for (int64_t i = n - 1; i >= 1; --i) {
          float* xi = x + i * per_sample + k0;
          blend(xi - per_sample, xi, xi, count, a, b);
        }
        blend(last.data(), x + k0, x + k0, count, a, b);
      }
    });
  });
}

}  // namespace gpupipe
