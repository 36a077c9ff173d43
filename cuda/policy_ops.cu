// CUDA kernels of the augmentation policies: the per-pixel math of csrc/augment/policy_ops.h and the
// warp of csrc/augment/augment_pixel.h, shared with the host kernels (csrc/augment/policy_cpu.cpp), so
// both round alike.
//
// Launched once per op slot: one policy_apply_cuda call is ONE op slot of every sample, run as
// three launches over the whole batch (per-sample statistics in shared-memory histograms, per-sample
// lookup tables, then one thread per output pixel), and the Python op
// (gpupipe/augment/_policy_kernels.py) calls it once per slot, slot after slot on the same stream: a
// policy of S slots costs 3 * S launches and S - 1 batch-sized intermediates. (The host kernels run
// all the slots in one call, folding consecutive table ops per sample.)
#include <cuda_runtime.h>

#include "policy_cuda.h"

namespace gpupipe {
namespace {

using namespace policy;

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = 65535;

// Statistics of the samples whose op needs them: blockIdx.y is the sample (offset by `first`),
// the blocks along x share its pixels and merge their shared-memory counts with atomics.
__global__ void stats_kernel(PolicyArgs a, int64_t first, PolicyWorkspace work) {
  const int64_t n = first + blockIdx.y;
  const int32_t kind = static_cast<int32_t>(a.kinds[n]);
  const bool counts = needs_histogram(kind) || needs_range(kind);  // ranges come from the histograms here
  if (!counts && !needs_gray_sum(kind)) return;
  __shared__ uint32_t hist[768];
  __shared__ unsigned long long gray;
  for (int i = threadIdx.x; i < 768; i += blockDim.x) hist[i] = 0;
  if (threadIdx.x == 0) gray = 0;
  __syncthreads();
  const pixel::Image8 im = a.input.sample(n);
  const int64_t plane = im.h * im.w;
  unsigned long long sum = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < plane;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t y = i / im.w, x = i - y * im.w;
    const uint8_t* p = im.data + y * im.sy + x * im.sx;
    if (counts) {
      atomicAdd(&hist[p[0]], 1u);
      atomicAdd(&hist[256 + p[im.sc]], 1u);
      atomicAdd(&hist[512 + p[2 * im.sc]], 1u);
    } else {
      sum += static_cast<unsigned long long>(gray_floor(p[0], p[im.sc], p[2 * im.sc]));
    }
  }
  if (needs_gray_sum(kind)) atomicAdd(&gray, sum);
  __syncthreads();
  for (int i = threadIdx.x; i < 768; i += blockDim.x)
    if (hist[i]) atomicAdd(&work.hist[768 * n + i], static_cast<unsigned long long>(hist[i]));
  if (threadIdx.x == 0 && gray) atomicAdd(&work.gray_sum[n], gray);
}

__global__ void table_kernel(PolicyArgs a, PolicyWorkspace work) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n >= a.input.n) return;
  const int32_t kind = static_cast<int32_t>(a.kinds[n]);
  if (!is_lut_kind(kind)) return;
  Stats s;
  s.hist = work.hist + 768 * n;
  s.gray_sum = static_cast<int64_t>(work.gray_sum[n]);
  s.pixels = a.input.h * a.input.w;
  if (needs_range(kind)) range_from_histogram(s.hist, &s);
  build_lut(kind, a.params[n], s, work.luts + 768 * n);
}

__global__ void pixel_kernel(PolicyArgs a, PolicyWorkspace work) {
  const int64_t h = a.input.h, w = a.input.w, plane = h * w, total = a.input.n * plane;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = i / plane, yx = i - b * plane, y = yx / w, x = yx - y * w;
    const int32_t kind = static_cast<int32_t>(a.kinds[b]);
    const pixel::Image8 im = a.input.sample(b);
    const uint8_t* p = im.data + y * im.sy + x * im.sx;
    uint8_t* o = a.output_row(b, y) + x * a.out_stride[3];
    const int64_t oc = a.out_stride[1];
    if (kind == kAffine) {
      float sx, sy, v[3];
      pixel::affine_source(a.matrices + 6 * b, static_cast<float>(x), static_cast<float>(y), &sx, &sy);
      pixel::sample(im, a.interpolation, a.fill, sx, sy, v);
      for (int c = 0; c < 3; ++c) o[c * oc] = pixel::to_uint8(v[c]);
    } else if (kind == kColor) {
      const float r = p[0], g = p[im.sc], bl = p[2 * im.sc];
      const float gray = gray_floor(r, g, bl);
      const Blend blend = make_blend(a.params[b]);
      o[0] = blend_pixel(blend, r, gray);
      o[oc] = blend_pixel(blend, g, gray);
      o[2 * oc] = blend_pixel(blend, bl, gray);
    } else if (kind == kSharpness && y > 0 && y + 1 < h && x > 0 && x + 1 < w) {
      const float alpha = static_cast<float>(1.0 - a.params[b]);
      for (int c = 0; c < 3; ++c) {
        const uint8_t* q = p + c * im.sc;
        int32_t sum9 = 0;
        for (int dy = -1; dy <= 1; ++dy)
          for (int dx = -1; dx <= 1; ++dx) sum9 += q[dy * im.sy + dx * im.sx];
        o[c * oc] = sharpen_pixel(sum9, q[0], alpha);
      }
    } else if (is_lut_kind(kind) && kind != kIdentity) {
      const uint8_t* lut = work.luts + 768 * b;
      for (int c = 0; c < 3; ++c) o[c * oc] = lut[256 * c + p[c * im.sc]];
    } else {  // kIdentity, sharpness borders (and, defensively, unknown kinds)
      for (int c = 0; c < 3; ++c) o[c * oc] = p[c * im.sc];
    }
  }
}

int blocks_for(int64_t total) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < kMaxGrid * 16 ? blocks : kMaxGrid * 16);
}

}  // namespace

int policy_apply_cuda(const PolicyArgs& a, const PolicyWorkspace& work, void* stream) {
  const int64_t n = a.input.n, plane = a.input.h * a.input.w;
  if (n == 0 || plane == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t per_sample = (plane + 8 * kThreads - 1) / (8 * kThreads);  // ~8 pixels per thread
  const unsigned blocks_x = static_cast<unsigned>(per_sample < 64 ? per_sample : 64);
  for (int64_t first = 0; first < n; first += kMaxGrid) {
    const unsigned count = static_cast<unsigned>(n - first < kMaxGrid ? n - first : kMaxGrid);
    stats_kernel<<<dim3(blocks_x, count), kThreads, 0, s>>>(a, first, work);
  }
  table_kernel<<<static_cast<unsigned>((n + 63) / 64), 64, 0, s>>>(a, work);
  pixel_kernel<<<blocks_for(n * plane), kThreads, 0, s>>>(a, work);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace gpupipe
