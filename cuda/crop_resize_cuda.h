// Launcher of the ragged crop-resize's CUDA kernels: plain pointers and a stream handle, no torch ABI.
#pragma once

#include <stdint.h>

#include "decode/crop_resize_kernels.h"

namespace gpupipe {

// Runs the batch of the n-sample table on `stream` (a cudaStream_t, e.g. torch's current stream):
// three launches, the coefficients, the first pass, the second (none when no sample has one). `table`
// is the planner's, in host memory (it sizes the grid); the caller has queued its copy to the head of
// `scratch` on `stream` before (from pinned memory: a copy from pageable memory may wait for the
// stream's earlier work). `out` and `scratch` are device memory; the arguments were checked
// (check_crop_launch). Returns the cudaError_t of the launches (0 = success).
int crop_resize_cuda(const CropResizeSample* table, int64_t n, uint8_t* out, int64_t out_h, int64_t out_w,
                     int64_t channels, uint8_t* scratch, void* stream);

}  // namespace gpupipe
