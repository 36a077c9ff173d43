// CUDA kernel of the fused augmentation: one thread per output pixel, per-sample 3x4 color matrix
// and flips (index math, no extra pass), uint8/float input with any strides, NCHW output in
// float32 / bfloat16 / float16. The per-pixel math is fused_color.cuh, shared with the host kernel.
#include <cuda_runtime.h>

#include "fused_augment_cuda.h"
#include "fused_color.cuh"

namespace gpupipe {
namespace {

struct StoreF32 {
  __device__ float operator()(float v) const { return v; }
};
struct StoreBF16 {
  __device__ uint16_t operator()(float v) const { return fused::to_bfloat16_bits(v); }
};
struct StoreF16 {
  __device__ uint16_t operator()(float v) const { return fused::to_float16_bits(v); }
};

template <typename In, typename Out, typename Store>
__global__ void fused_color_affine_kernel(const In* __restrict__ in, int64_t n, int64_t h, int64_t w,
                                          int64_t s0, int64_t s1, int64_t s2, int64_t s3,
                                          const float* __restrict__ matrices,
                                          const uint8_t* __restrict__ hflip,
                                          const uint8_t* __restrict__ vflip, Out* __restrict__ out,
                                          Store store) {
  const int64_t plane = h * w;
  const int64_t total = n * plane;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = i / plane, yx = i - b * plane, y = yx / w, x = yx - y * w;
    const int64_t sy = fused::source_index(y, h, vflip[b] != 0);
    const int64_t sx = fused::source_index(x, w, hflip[b] != 0);
    const In* p = in + b * s0 + sy * s2 + sx * s3;
    float o[3];
    fused::apply_matrix(matrices + 12 * b, static_cast<float>(p[0]), static_cast<float>(p[s1]),
                        static_cast<float>(p[2 * s1]), o);
    Out* dst = out + b * 3 * plane + yx;
    dst[0] = store(o[0]);
    dst[plane] = store(o[1]);
    dst[2 * plane] = store(o[2]);
  }
}

template <typename In>
cudaError_t launch(const fused::FusedArgs& a, cudaStream_t stream) {
  const int64_t total = a.n * a.h * a.w;
  if (total == 0) return cudaSuccess;
  const int threads = 256;
  const int64_t blocks64 = (total + threads - 1) / threads;
  const int blocks = static_cast<int>(blocks64 < 65535 * 16 ? blocks64 : 65535 * 16);
  const In* in = static_cast<const In*>(a.input);
  const int64_t* s = a.in_stride;
  switch (a.out_dtype) {
    case fused::kFloat32:
      fused_color_affine_kernel<<<blocks, threads, 0, stream>>>(
          in, a.n, a.h, a.w, s[0], s[1], s[2], s[3], a.matrices, a.hflip, a.vflip,
          static_cast<float*>(a.output), StoreF32{});
      break;
    case fused::kBFloat16:
      fused_color_affine_kernel<<<blocks, threads, 0, stream>>>(
          in, a.n, a.h, a.w, s[0], s[1], s[2], s[3], a.matrices, a.hflip, a.vflip,
          static_cast<uint16_t*>(a.output), StoreBF16{});
      break;
    default:
      fused_color_affine_kernel<<<blocks, threads, 0, stream>>>(
          in, a.n, a.h, a.w, s[0], s[1], s[2], s[3], a.matrices, a.hflip, a.vflip,
          static_cast<uint16_t*>(a.output), StoreF16{});
      break;
  }
  return cudaGetLastError();
}

}  // namespace

int fused_color_affine_cuda(const fused::FusedArgs& a, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t err = a.input_is_uint8 ? launch<uint8_t>(a, s) : launch<float>(a, s);
  return static_cast<int>(err);
}

}  // namespace gpupipe
