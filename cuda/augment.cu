// CUDA kernels of gpupipe's augmentations: the per-pixel math of csrc/augment/augment_pixel.h and
// csrc/augment/augment_kernels.h (shared with the host build in csrc/augment/augment_cpu.cpp, and
// rounded alike: _rn intrinsics, built with --fmad=false). BatchAugment's engine runs as one fused
// launch on sm_90 (clusters, below) and as two launches elsewhere (contrast's means, then the output).
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "augment_cuda.h"
#include "check_launch.h"

namespace gpupipe {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t total, int64_t cap) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < cap ? blocks : cap);
}

template <typename Out>
__global__ void warp_affine_kernel(WarpArgs a, Out* __restrict__ out) {
  const int64_t h = a.input.h, w = a.input.w, plane = h * w, total = a.input.n * plane;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = i / plane, yx = i - b * plane, y = yx / w, x = yx - y * w;
    float sx, sy, v[3];
    pixel::affine_source(a.matrices + 6 * b, static_cast<float>(x), static_cast<float>(y), &sx, &sy);
    pixel::sample(a.input.sample(b), a.interpolation, a.fill, sx, sy, v);
    Out* o = out + b * a.out_stride[0] + y * a.out_stride[2] + x * a.out_stride[3];
    for (int c = 0; c < 3; ++c) {
      if constexpr (sizeof(Out) == 1) o[c * a.out_stride[1]] = pixel::to_uint8(v[c]);
      else o[c * a.out_stride[1]] = v[c];
    }
  }
}

// The two-pass engine's blocks are 32 x 8 tiles of one sample's output (blockIdx.y = the sample):
// no index division per pixel, 2-D locality for the warped reads, per-sample values shared.
constexpr int kTileW = 32, kTileH = 8;
static_assert(kTileW * kTileH == kThreads, "the two-pass kernels' block_sum assumes kThreads threads");

// Sums an int64 over a block of kBlock threads; the result is valid in thread 0. Integer sums: any
// order, same bits.
template <int kBlock = kThreads>
__device__ int64_t block_sum(int64_t v) {
  static_assert(kBlock % 32 == 0 && kBlock <= 1024, "whole warps, one warp of partial sums");
  __shared__ int64_t warp_sums[kBlock / 32];
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  const int t = threadIdx.y * blockDim.x + threadIdx.x, lane = t & 31, warp = t >> 5;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = 0;
  if (warp == 0) {
    v = lane < kBlock / 32 ? warp_sums[lane] : 0;
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  return v;
}

// The sample's parameter row and its color program, in shared memory once per block.
__device__ void load_sample(const AugmentArgs& a, int64_t i, float* P, ColorProgram* prog) {
  const int t = threadIdx.y * blockDim.x + threadIdx.x;
  if (t < param::kCount) P[t] = a.params[i * param::kCount + t];
  __syncthreads();
  if (t == 0) *prog = color_program(P);
  __syncthreads();
}

// Calls fn(x, y) for every output pixel of the sample: block b takes the tile rows b, b + gridDim.x,
// ..., each 32 x 8 tile of the row in turn. No index division per pixel, and the block's per-sample
// setup (parameters, contrast mean) is paid once for many tiles.
template <typename Fn>
__device__ void for_each_pixel(int64_t h, int64_t w, Fn&& fn) {
  for (int64_t y = blockIdx.x * static_cast<int64_t>(kTileH) + threadIdx.y; y - threadIdx.y < h;
       y += static_cast<int64_t>(gridDim.x) * kTileH) {
    for (int64_t x = threadIdx.x; x - threadIdx.x < w; x += kTileW) {
      if (x < w && y < h) fn(x, y);
    }
  }
}

// Tile-row blocks per sample for the output pass: enough blocks in all to fill the device a few
// times over, each taking as many tile rows as that allows.
unsigned row_blocks(int64_t n, int64_t h) {
  const int64_t tile_rows = (h + kTileH - 1) / kTileH;
  int64_t per_sample = (16384 + n - 1) / n;
  per_sample = per_sample < tile_rows ? per_sample : tile_rows;
  return static_cast<unsigned>(per_sample < 1 ? 1 : per_sample);
}

// Grid rows, one per sample, at most 65535: samples beyond are taken by the same blocks in turn.
unsigned sample_blocks(int64_t n) { return static_cast<unsigned>(n < 65535 ? n : 65535); }

// Output pixel (x, y) of sample P: its warped input on the 0..255 scale (Offset: pixel::sample's).
template <typename Offset = int64_t>
__device__ void warped_pixel(const AugmentArgs& a, const float* P, const pixel::Image8& im, int64_t x, int64_t y,
                             float v[3]) {
  float sx, sy;
  pixel::affine_source(P + param::kMatrix, static_cast<float>(x), static_cast<float>(y), &sx, &sy);
  pixel::sample<Offset>(im, a.interpolation, a.fill, sx, sy, v);
}

// Pass 1, grid (kMeanBlocks, n): partial sums of mean_fixed(mean_luma) per sample.
__global__ void mean_kernel(AugmentArgs a) {
  __shared__ float P[param::kCount];
  __shared__ ColorProgram prog;
  for (int64_t i = blockIdx.y; i < a.input.n; i += gridDim.y) {
    load_sample(a, i, P, &prog);
    int64_t sum = 0;
    if (needs_mean(a, i)) {
      const pixel::Image8 im = a.input.sample(i);
      for_each_pixel(a.input.h, a.input.w, [&](int64_t x, int64_t y) {
        float v[1][3];
        warped_pixel(a, P, im, x, y, v[0]);
        chain_before_mean_px(a, prog, v);
        sum += pixel::mean_fixed(mean_luma(a, v[0]));
      });
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0 && threadIdx.y == 0) a.mean_partials[i * kMeanBlocks + blockIdx.x] = sum;
    __syncthreads();  // P, prog and the block sum's scratch are reused by the next sample
  }
}

// The sample's contrast mean from its kMeanBlocks partial sums, by the block's first warp (integer
// sums: any order, same bits); valid in thread 0.
__device__ float sample_mean(const AugmentArgs& a, int64_t i) {
  int64_t sum = 0;
  const int lane = threadIdx.x;
  if (threadIdx.y == 0) {
    for (int k = lane; k < kMeanBlocks; k += 32) sum += a.mean_partials[i * kMeanBlocks + k];
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  }
  return pixel::mean_from_sum(sum, a.input.h * a.input.w);
}

struct StoreF32 {
  __device__ float operator()(float v) const { return v; }
};
struct StoreBF16 {
  __device__ uint16_t operator()(float v) const { return pixel::to_bfloat16_bits(v); }
};
struct StoreF16 {
  __device__ uint16_t operator()(float v) const { return pixel::to_float16_bits(v); }
};

// Offset: the type of element offsets within the sample's output (int32_t where checked to fit).
template <typename Offset = int64_t, typename Out, typename Store>
__device__ void store_pixel(const int64_t* os, Out* base, int64_t x, int64_t y, const float v[3], Store store) {
  const Offset sc = static_cast<Offset>(os[1]);
  Out* o = base + (static_cast<Offset>(y) * static_cast<Offset>(os[2]) + static_cast<Offset>(x) * static_cast<Offset>(os[3]));
  o[0] = store(v[0]);
  o[sc] = store(v[1]);
  o[2 * sc] = store(v[2]);
}

// Pass 2, grid (tiles, n): every output pixel of sample blockIdx.y.
template <typename Out, typename Store>
__global__ void augment_kernel(AugmentArgs a, Out* __restrict__ out, Store store) {
  __shared__ float P[param::kCount];
  __shared__ ColorProgram prog;
  __shared__ MeanTerms terms;
  for (int64_t i = blockIdx.y; i < a.input.n; i += gridDim.y) {
    load_sample(a, i, P, &prog);
    const bool mean_needed = needs_mean(a, i);  // block-uniform
    const float mean = mean_needed ? sample_mean(a, i) : 0.0f;
    if (threadIdx.x == 0 && threadIdx.y == 0) terms = mean_terms(a, P, mean);
    __syncthreads();
    const pixel::Image8 im = a.input.sample(i);
    Out* base = out + i * a.out_stride[0];
    for_each_pixel(a.input.h, a.input.w, [&](int64_t x, int64_t y) {
      float v[1][3];
      warped_pixel(a, P, im, x, y, v[0]);
      chain_before_mean_px(a, prog, v);
      chain_after_mean_px(a, P, prog, terms, v);
      store_pixel(a.out_stride, base, x, y, v[0], store);
    });
    __syncthreads();  // P, prog and terms are reused by the next sample
  }
}

template <typename Out, typename Store>
void launch_augment(const AugmentArgs& a, cudaStream_t s, Store store) {
  const dim3 grid(row_blocks(a.input.n, a.input.h), sample_blocks(a.input.n));
  augment_kernel<<<grid, dim3(kTileW, kTileH), 0, s>>>(a, static_cast<Out*>(a.output), store);
}

// --- the fused path: one launch, every pixel sampled and coloured once (sm_90 clusters) ----------
// One cluster of C blocks per sample (C up to 8, or 16 where the device allows), each block taking
// a C-th of its rows. Pass 1 keeps each pixel's state after chain_before_mean_px in the block's
// shared memory (3 float planes) and sums its luma; the C partial sums meet through distributed
// shared memory; pass 2 finishes the chain from the kept state. Each thread reads back only what
// it wrote. Images whose state does not fit a cluster's shared memory, and GPUs before sm_90, take
// the two passes above.
constexpr int kFusedTileH = 16;
constexpr int kFusedThreads = kTileW * kFusedTileH;  // the block is kTileW x kFusedTileH
constexpr int64_t kFusedStateBytes = 100 * 1024;    // per block at most: two blocks of 512 per SM
constexpr int kPortableCluster = 8;                 // every sm_90 device schedules these
constexpr int kMaxCluster = 16;                     // where the device allows it (H100)

// A fused launch's shape: `cluster` blocks per sample, each keeping `rows` rows of state.
struct FusedShape {
  int cluster = 0, rows = 0;
  size_t state_bytes = 0;
};

// The smallest cluster whose blocks' state fits `budget` bytes; cluster 0 when none does (with the
// 100 KiB of sm_90: 256 x 256 in 8 blocks, 364 x 364 in 16).
FusedShape fused_shape(int64_t h, int64_t w, int64_t budget) {
  for (int c = 1; c <= kMaxCluster; c *= 2) {
    const int64_t rows = (h + c - 1) / c, bytes = rows * w * 3 * static_cast<int64_t>(sizeof(float));
    if (bytes <= budget) return FusedShape{c, static_cast<int>(rows), static_cast<size_t>(bytes)};
  }
  return FusedShape{};
}

// Pixels per thread and step: their gathers in flight together, one op dispatch for them all.
constexpr int kStep = 2;
using Ints = int[kStep];
using Flags = bool[kStep];

// Thread t of a block walks the block's pixels q = t, t + T, t + 2T, ... (row-major over its rows,
// T threads), kStep at a time: coalesced stores and state, no division per pixel. fn(x, y, q, valid)
// gets kStep pixels; a slot past the end is not valid and repeats the first slot's pixel (always valid).
template <typename Fn>
__device__ void for_each_step(int rows, int w, Fn&& fn) {
  constexpr int T = kFusedThreads;
  const int count = rows * w, t = threadIdx.y * blockDim.x + threadIdx.x;
  const int dx = kStep * T % w, dy = kStep * T / w;
  int q[kStep], x[kStep], y[kStep];
  for (int j = 0; j < kStep; ++j) {
    q[j] = t + j * T;
    x[j] = q[j] % w;
    y[j] = q[j] / w;
  }
  while (q[0] < count) {
    Ints xs, ys, qs;
    Flags valid;
    for (int j = 0; j < kStep; ++j) {
      valid[j] = q[j] < count;
      xs[j] = valid[j] ? x[j] : x[0];
      ys[j] = valid[j] ? y[j] : y[0];
      qs[j] = valid[j] ? q[j] : q[0];
    }
    fn(xs, ys, qs, valid);
    for (int j = 0; j < kStep; ++j) {
      q[j] += kStep * T;
      x[j] += dx;
      y[j] += dy;
      if (x[j] >= w) {
        x[j] -= w;
        ++y[j];
      }
    }
  }
}

template <typename Out, typename Store>
__global__ void __launch_bounds__(kFusedThreads, 2)
    augment_fused_kernel(AugmentArgs a, Out* __restrict__ out, Store store, int rows_per_block) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  extern __shared__ float state[];  // 3 planes of rows_per_block x w
  __shared__ float P[param::kCount];
  __shared__ ColorProgram prog;
  __shared__ int64_t partial;
  __shared__ MeanTerms terms;
  const cg::cluster_group cluster = cg::this_cluster();
  const int h = static_cast<int>(a.input.h), w = static_cast<int>(a.input.w), plane = rows_per_block * w;
  const int y0 = static_cast<int>(cluster.block_rank()) * rows_per_block;
  const int rows = y0 >= h ? 0 : (h - y0 < rows_per_block ? h - y0 : rows_per_block);
  const bool first = threadIdx.x == 0 && threadIdx.y == 0;
  for (int64_t i = blockIdx.y; i < a.input.n; i += gridDim.y) {
    load_sample(a, i, P, &prog);
    const pixel::Image8 im = a.input.sample(i);
    Out* base = out + i * a.out_stride[0];
    auto sample_step = [&](const Ints& xs, const Ints& ys, float (&v)[kStep][3]) {
      for (int j = 0; j < kStep; ++j) warped_pixel<int32_t>(a, P, im, xs[j], y0 + ys[j], v[j]);
    };
    auto store_step = [&](const Ints& xs, const Ints& ys, const Flags& valid, float (&v)[kStep][3]) {
      for (int j = 0; j < kStep; ++j)
        if (valid[j]) store_pixel<int32_t>(a.out_stride, base, xs[j], y0 + ys[j], v[j], store);
    };
    if (needs_mean(a, i)) {  // cluster-uniform: the cluster's blocks share the sample
      int64_t sum = 0;
      for_each_step(rows, w, [&](const Ints& xs, const Ints& ys, const Ints& qs, const Flags& valid) {
        float v[kStep][3];
        sample_step(xs, ys, v);
        chain_before_mean_px(a, prog, v);
        for (int j = 0; j < kStep; ++j) {
          if (!valid[j]) continue;
          sum += pixel::mean_fixed(mean_luma(a, v[j]));
          state[qs[j]] = v[j][0];
          state[plane + qs[j]] = v[j][1];
          state[2 * plane + qs[j]] = v[j][2];
        }
      });
      sum = block_sum<kFusedThreads>(sum);
      if (first) partial = sum;
      cluster.sync();
      if (first) {
        int64_t total = 0;  // integers: the same bits in any order
        for (unsigned r = 0; r < cluster.num_blocks(); ++r) total += *cluster.map_shared_rank(&partial, r);
        terms = mean_terms(a, P, pixel::mean_from_sum(total, a.input.h * a.input.w));
      }
      __syncthreads();
      for_each_step(rows, w, [&](const Ints& xs, const Ints& ys, const Ints& qs, const Flags& valid) {
        float v[kStep][3];
        for (int j = 0; j < kStep; ++j)
          for (int c = 0; c < 3; ++c) v[j][c] = state[c * plane + qs[j]];
        chain_after_mean_px(a, P, prog, terms, v);
        store_step(xs, ys, valid, v);
      });
    } else {
      if (first) terms = mean_terms(a, P, 0.0f);
      __syncthreads();
      for_each_step(rows, w, [&](const Ints& xs, const Ints& ys, const Ints&, const Flags& valid) {
        float v[kStep][3];
        sample_step(xs, ys, v);
        chain_before_mean_px(a, prog, v);
        chain_after_mean_px(a, P, prog, terms, v);
        store_step(xs, ys, valid, v);
      });
    }
    cluster.sync();  // P, prog, terms and partial are reused by the next sample; others may read partial
  }
#else
  __trap();  // never launched: fused_enabled() requires code compiled for sm_90
#endif
}

// Whether every offset within one sample, of its input (bytes) and of its output (elements), fits
// the fused kernel's 32-bit offsets.
bool offsets_fit_int32(const AugmentArgs& a) {
  const auto extent = [&](const int64_t* stride) {  // stride: C, H, W
    auto mag = [](int64_t v) { return v < 0 ? -v : v; };
    return 2 * mag(stride[0]) + (a.input.h - 1) * mag(stride[1]) + (a.input.w - 1) * mag(stride[2]);
  };
  const int64_t limit = INT32_MAX;
  return extent(a.input.stride + 1) <= limit && extent(a.out_stride + 1) <= limit;
}

// Launches the fused kernel for output type Out (true) when this device and these samples allow it: the
// kernel was compiled for sm_90 or later (its PTX version: a module built without a sm_90 image
// would run a JIT-compiled empty body), GPUPIPE_CUDA_AUGMENT is not "two_pass" (the switch the
// tests and benchmarks of the fallback use), the state fits the device's shared memory, and the
// offsets fit 32 bits.
template <typename Out, typename Store>
bool launch_fused(const AugmentArgs& a, cudaStream_t s, Store store) {
  const char* env = getenv("GPUPIPE_CUDA_AUGMENT");
  if (env != nullptr && strcmp(env, "two_pass") == 0) return false;
  void (*kernel)(AugmentArgs, Out*, Store, int) = augment_fused_kernel<Out, Store>;
  cudaFuncAttributes attributes = {};
  int device = 0, optin = 0;
  if (cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess || cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    cudaGetLastError();  // the query's own error, not sticky: clear it, the caller falls back
    return false;
  }
  if (attributes.ptxVersion < 90) return false;
  const int64_t budget = optin - static_cast<int64_t>(attributes.sharedSizeBytes);
  const FusedShape shape = fused_shape(a.input.h, a.input.w, budget < kFusedStateBytes ? budget : kFusedStateBytes);
  if (shape.cluster == 0 || !offsets_fit_int32(a)) return false;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(shape.cluster), sample_blocks(a.input.n));
  config.blockDim = dim3(kTileW, kFusedTileH);
  config.dynamicSmemBytes = shape.state_bytes;
  config.stream = s;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(shape.cluster);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  // Clusters over the portable size only where the device can schedule one (asked before launching).
  int clusters = 1;
  const bool non_portable = shape.cluster > kPortableCluster;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shape.state_bytes)) !=
          cudaSuccess ||
      (non_portable && cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) ||
      (non_portable && cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) || clusters < 1 ||
      cudaLaunchKernelEx(&config, kernel, a, static_cast<Out*>(a.output), store, shape.rows) != cudaSuccess) {
    cudaGetLastError();  // a refused configuration is not sticky: clear it, the caller falls back
    return false;
  }
  return true;
}

bool try_fused(const AugmentArgs& a, cudaStream_t s) {
  switch (a.out_type) {
    case kFloat32: return launch_fused<float>(a, s, StoreF32{});
    case kBFloat16: return launch_fused<uint16_t>(a, s, StoreBF16{});
    default: return launch_fused<uint16_t>(a, s, StoreF16{});
  }
}

}  // namespace

int warp_affine_cuda(const WarpArgs& a, void* stream) {
  const int64_t total = a.input.n * a.input.h * a.input.w;
  if (total == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (a.out_type == kUInt8)
    warp_affine_kernel<<<blocks_for(total, 65535 * 16), kThreads, 0, s>>>(a, static_cast<uint8_t*>(a.output));
  else
    warp_affine_kernel<<<blocks_for(total, 65535 * 16), kThreads, 0, s>>>(a, static_cast<float*>(a.output));
  return static_cast<int>(cudaGetLastError());
}

int augment_cuda(const AugmentArgs& a, void* stream) {
  if (a.input.n == 0 || a.input.h == 0 || a.input.w == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (try_fused(a, s)) return 0;
  mean_kernel<<<dim3(kMeanBlocks, sample_blocks(a.input.n)), dim3(kTileW, kTileH), 0, s>>>(a);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return static_cast<int>(err);
  switch (a.out_type) {
    case kFloat32: launch_augment<float>(a, s, StoreF32{}); break;
    case kBFloat16: launch_augment<uint16_t>(a, s, StoreBF16{}); break;
    default: launch_augment<uint16_t>(a, s, StoreF16{}); break;
  }
  return static_cast<int>(cudaGetLastError());
}

const char* cuda_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

}  // namespace gpupipe
