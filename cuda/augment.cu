// CUDA kernels of gpupipe's augmentations: one thread per output pixel, the per-pixel math of
// csrc/augment_pixel.h (shared with the host build in csrc/augment_cpu.cpp, and rounded alike).
#include <cuda_runtime.h>

#include "augment_cuda.h"

namespace gpupipe {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t total) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 16 ? blocks : 65535 * 16);
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

}  // namespace

int warp_affine_cuda(const WarpArgs& a, void* stream) {
  const int64_t total = a.input.n * a.input.h * a.input.w;
  if (total == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (a.out_type == kUInt8)
    warp_affine_kernel<<<blocks_for(total), kThreads, 0, s>>>(a, static_cast<uint8_t*>(a.output));
  else
    warp_affine_kernel<<<blocks_for(total), kThreads, 0, s>>>(a, static_cast<float*>(a.output));
  return static_cast<int>(cudaGetLastError());
}

const char* cuda_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

}  // namespace gpupipe
