// GPUPIPE_HD marks the functions shared by a CUDA kernel and its host build: __host__ __device__
// under nvcc, plain inline for the C++ compiler.
#pragma once

#if defined(__CUDACC__)
#define GPUPIPE_HD __host__ __device__ __forceinline__
#else
#define GPUPIPE_HD inline
#endif
