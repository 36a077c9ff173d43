// Per-pixel math of the fused augmentation, shared by the CUDA kernel (fused_augment.cu) and the
// host kernel (csrc/fused_augment_cpu.cpp), so the GPU's arithmetic is tested on machines without
// one. One output pixel = a per-sample 3x4 affine color matrix applied to the (optionally flipped)
// input pixel, converted to the output dtype.
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#define GPUPIPE_HD __host__ __device__ __forceinline__
#else
#define GPUPIPE_HD inline
#endif

namespace gpupipe {
namespace fused {

enum OutDType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

// One launch of the fused op, for the host kernel and the CUDA kernel alike.
struct FusedArgs {
  const void* input = nullptr;
  bool input_is_uint8 = true;          // else float32
  int64_t n = 0, h = 0, w = 0;
  int64_t in_stride[4] = {0, 0, 0, 0};  // elements, in N, C, H, W order
  const float* matrices = nullptr;     // n x 12 (row-major 3x4 per sample)
  const uint8_t* hflip = nullptr;      // n (0/1)
  const uint8_t* vflip = nullptr;      // n (0/1)
  void* output = nullptr;              // n x 3 x h x w, contiguous
  int out_dtype = 0;                   // OutDType
};

// Fills FusedArgs from the integers the Python bindings receive (tensors' data_ptr()s).
inline FusedArgs make_args(uintptr_t input, bool input_is_uint8, int64_t n, int64_t h, int64_t w,
                           const int64_t* strides, uintptr_t matrices, uintptr_t hflip, uintptr_t vflip,
                           uintptr_t output, int out_dtype) {
  FusedArgs a;
  a.input = reinterpret_cast<const void*>(input);
  a.input_is_uint8 = input_is_uint8;
  a.n = n;
  a.h = h;
  a.w = w;
  for (int i = 0; i < 4; ++i) a.in_stride[i] = strides[i];
  a.matrices = reinterpret_cast<const float*>(matrices);
  a.hflip = reinterpret_cast<const uint8_t*>(hflip);
  a.vflip = reinterpret_cast<const uint8_t*>(vflip);
  a.output = reinterpret_cast<void*>(output);
  a.out_dtype = out_dtype;
  return a;
}

// out = m[:, :3] @ (r, g, b) + m[:, 3]; m is row-major 3x4.
GPUPIPE_HD void apply_matrix(const float* m, float r, float g, float b, float out[3]) {
  out[0] = m[0] * r + m[1] * g + m[2] * b + m[3];
  out[1] = m[4] * r + m[5] * g + m[6] * b + m[7];
  out[2] = m[8] * r + m[9] * g + m[10] * b + m[11];
}

// The input coordinate read for output coordinate i of an axis of length n.
GPUPIPE_HD int64_t source_index(int64_t i, int64_t n, bool flip) { return flip ? n - 1 - i : i; }

GPUPIPE_HD uint32_t float_bits(float f) {
  union {
    float f;
    uint32_t u;
  } v;
  v.f = f;
  return v.u;
}

// float -> bfloat16 bits, round to nearest even (NaN stays NaN), as torch's conversion.
GPUPIPE_HD uint16_t to_bfloat16_bits(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// float -> IEEE half bits, round to nearest even, overflow to inf, subnormals kept.
GPUPIPE_HD uint16_t to_float16_bits(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (abs < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25 rounds to 0
    // value / 2^-24 = mantissa24 * 2^(exp - 126): drop (126 - exp) bits, rounding to even.
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const int drop = 126 - static_cast<int>(abs >> 23);
    const uint32_t rounded = (mant + ((1u << (drop - 1)) - 1u) + ((mant >> drop) & 1u)) >> drop;
    return static_cast<uint16_t>(sign | rounded);
  }
  uint32_t h = abs - 0x38000000u;  // rebias exponent 127 -> 15 (in the float's bit positions)
  h = (h + 0xfffu + ((h >> 13) & 1u)) >> 13;
  return static_cast<uint16_t>(sign | h);
}

}  // namespace fused
}  // namespace gpupipe
