// Launcher of the ragged crop-resize's CUDA kernels: plain pointers and a stream handle, no torch ABI.
#pragma once

#include <stdint.h>

#include "decode/crop_resize_kernels.h"

namespace gpupipe {

// Copies the n-sample table (host memory, the planner's) to the head of `scratch` and runs the batch
// on `stream` (a cudaStream_t, e.g. torch's current stream): three launches, the coefficients, the
// first pass, the second (none when no sample has one). `out` and `scratch` are device memory; the
// arguments were checked (check_crop_launch). Returns the cudaError_t of the copy and launches (0 =
// success). The table may be freed on return (a pageable copy is staged before cudaMemcpyAsync returns;
// measured on an H200, a 24 KB one returned at once behind 100 ms of queued work, benchmarks/sync_probe.py).
int crop_resize_cuda(const CropResizeSample* table, int64_t n, uint8_t* out, int64_t out_h, int64_t out_w,
                     int64_t channels, uint8_t* scratch, void* stream);

}  // namespace gpupipe
