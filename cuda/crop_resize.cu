// CUDA kernels of the ragged crop-resize: the host build's steps (csrc/decode/crop_resize.cpp) with
// the same per-value functions (csrc/decode/crop_resize_kernels.h, crop_resize_pixel.h: _rn double
// intrinsics, built with --fmad=false), so the device writes the host build's bytes.
//
// Grid of every launch: blockIdx.y = the sample (samples past 65535 taken by the same blocks in
// turn), blockIdx.x = a tile of its work: 256 coefficient entries, or kRowsPerBlock rows of a pass,
// whose bytes the block's threads share out. Adjacent threads write adjacent bytes of a row and read
// adjacent bytes (a vertical tap row, the copy) or neighbouring pixels of one row (horizontal taps),
// so reads and writes coalesce. Blocks past a sample's rows (samples have different box heights)
// return at once.
#include <cuda_runtime.h>
#include <stdint.h>

#include "crop_resize_cuda.h"

namespace gpupipe {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = 4;  // a 224-pixel RGB row is 672 bytes: ~10 values per thread a block

unsigned sample_blocks(int64_t n) { return static_cast<unsigned>(n < 65535 ? n : 65535); }

__global__ void coeff_kernel(CropResizeArgs a) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= a.out_w + a.out_h) return;
  for (int64_t i = blockIdx.y; i < a.n; i += gridDim.y) coeff_entry(a, a.samples[i], j);
}

__global__ void pass_kernel(CropResizeArgs a, bool second) {
  for (int64_t i = blockIdx.y; i < a.n; i += gridDim.y) {
    const PassView v = pass_view(a, a.samples[i], second);
    const int32_t first = static_cast<int32_t>(blockIdx.x) * kRowsPerBlock;
    const int32_t last = v.rows < first + kRowsPerBlock ? v.rows : first + kRowsPerBlock;
    for (int32_t r = first; r < last; ++r) {
      uint8_t* row = v.out + r * v.out_stride;
      for (int32_t b = threadIdx.x; b < v.row_bytes; b += kThreads) row[b] = pass_value(v, r, b);
    }
  }
}

unsigned row_tiles(int64_t rows) { return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

int crop_resize_cuda(const CropResizeSample* table, int64_t n, uint8_t* out, int64_t out_h, int64_t out_w,
                     int64_t channels, uint8_t* scratch, void* stream) {
  if (n == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaMemcpyAsync(scratch, table, static_cast<size_t>(n) * sizeof(CropResizeSample),
                                    cudaMemcpyHostToDevice, s);
  if (err != cudaSuccess) return err;
  CropResizeArgs a;
  a.samples = reinterpret_cast<const CropResizeSample*>(scratch);
  a.n = n;
  a.out = out;
  a.out_h = out_h;
  a.out_w = out_w;
  a.channels = channels;
  a.scratch = scratch;
  int64_t first_rows = 0, second_rows = 0;  // the grid covers the sample with the most rows
  for (int64_t i = 0; i < n; ++i) {
    first_rows = table[i].first_rows > first_rows ? table[i].first_rows : first_rows;
    second_rows = table[i].second_rows > second_rows ? table[i].second_rows : second_rows;
  }
  const unsigned ys = sample_blocks(n);
  coeff_kernel<<<dim3(static_cast<unsigned>((out_w + out_h + kThreads - 1) / kThreads), ys), kThreads, 0, s>>>(a);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  pass_kernel<<<dim3(row_tiles(first_rows), ys), kThreads, 0, s>>>(a, false);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  if (second_rows > 0) {
    pass_kernel<<<dim3(row_tiles(second_rows), ys), kThreads, 0, s>>>(a, true);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  return 0;
}

}  // namespace gpupipe
