// CUDA kernels of gpupipe's augmentations: one thread per output pixel, the per-pixel math of
// csrc/augment_pixel.h and csrc/augment_kernels.h (shared with the host build in
// csrc/augment_cpu.cpp, and rounded alike: _rn intrinsics, built with --fmad=false).
#include <cuda_runtime.h>

#include "augment_cuda.h"

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

// The engine's blocks are 32 x 8 tiles of one sample's output (blockIdx.y = the sample): no index
// division per pixel, 2-D locality for the warped reads, and per-sample values shared by the block.
constexpr int kTileW = 32, kTileH = 8;
static_assert(kTileW * kTileH == kThreads, "block_sum assumes kThreads threads per block");

// Sums an int64 over the block; the result is valid in thread 0. Integer sums: any order, same bits.
__device__ int64_t block_sum(int64_t v) {
  __shared__ int64_t warp_sums[kThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  const int t = threadIdx.y * blockDim.x + threadIdx.x, lane = t & 31, warp = t >> 5;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = 0;
  if (warp == 0) {
    v = lane < kThreads / 32 ? warp_sums[lane] : 0;
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  return v;
}

// The sample's parameter row, copied to shared memory once per block.
__device__ void load_params(const AugmentArgs& a, int64_t i, float* shared) {
  const int t = threadIdx.y * blockDim.x + threadIdx.x;
  if (t < param::kCount) shared[t] = a.params[i * param::kCount + t];
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

// Output pixel (x, y) of sample P: its warped input on the 0..255 scale.
__device__ void warped_pixel(const AugmentArgs& a, const float* P, const pixel::Image8& im, int64_t x, int64_t y,
                             float v[3]) {
  float sx, sy;
  pixel::affine_source(P + param::kMatrix, static_cast<float>(x), static_cast<float>(y), &sx, &sy);
  pixel::sample(im, a.interpolation, a.fill, sx, sy, v);
}

// Pass 1, grid (kMeanBlocks, n): partial sums of mean_fixed(luma_for_mean) per sample.
__global__ void mean_kernel(AugmentArgs a) {
  __shared__ float P[param::kCount];
  for (int64_t i = blockIdx.y; i < a.input.n; i += gridDim.y) {
    load_params(a, i, P);
    int64_t sum = 0;
    if (needs_mean(a, i)) {
      const pixel::Image8 im = a.input.sample(i);
      for_each_pixel(a.input.h, a.input.w, [&](int64_t x, int64_t y) {
        float v[3];
        warped_pixel(a, P, im, x, y, v);
        sum += pixel::mean_fixed(luma_for_mean(a, P, v[0], v[1], v[2]));
      });
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0 && threadIdx.y == 0) a.mean_partials[i * kMeanBlocks + blockIdx.x] = sum;
    __syncthreads();  // P and the block sum's scratch are reused by the next sample
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

// Pass 2, grid (tiles, n): every output pixel of sample blockIdx.y.
template <typename Out, typename Store>
__global__ void augment_kernel(AugmentArgs a, Out* __restrict__ out, Store store) {
  __shared__ float P[param::kCount];
  __shared__ MeanTerms terms;
  for (int64_t i = blockIdx.y; i < a.input.n; i += gridDim.y) {
    load_params(a, i, P);
    const bool mean_needed = needs_mean(a, i);  // block-uniform
    const float mean = mean_needed ? sample_mean(a, i) : 0.0f;
    if (threadIdx.x == 0 && threadIdx.y == 0) terms = mean_terms(a, P, mean);
    __syncthreads();
    const pixel::Image8 im = a.input.sample(i);
    const int64_t* os = a.out_stride;
    Out* base = out + i * os[0];
    for_each_pixel(a.input.h, a.input.w, [&](int64_t x, int64_t y) {
      float v[3];
      warped_pixel(a, P, im, x, y, v);
      color_chain(a, P, terms, v);
      Out* o = base + y * os[2] + x * os[3];
      o[0] = store(v[0]);
      o[os[1]] = store(v[1]);
      o[2 * os[1]] = store(v[2]);
    });
    __syncthreads();  // P and terms are reused by the next sample
  }
}

template <typename Out, typename Store>
void launch_augment(const AugmentArgs& a, cudaStream_t s, Store store) {
  const dim3 grid(row_blocks(a.input.n, a.input.h), sample_blocks(a.input.n));
  augment_kernel<<<grid, dim3(kTileW, kTileH), 0, s>>>(a, static_cast<Out*>(a.output), store);
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
