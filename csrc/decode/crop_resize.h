// Crop-and-resize over a ragged batch: box i of image i (whole decoded images, each its own size and
// row pitch) resized into slot slots[i] of one uint8 [B, OH, OW, C] buffer, with the CPU core's
// semantics (Resampler: Pillow's antialiased BILINEAR; crop then resize, or `window`). The plan is
// made here; it runs here (crop_resize_host) or as CUDA kernels (cuda/crop_resize.cu), both through
// crop_resize_kernels.h, in the same steps over the same scratch layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "decode/crop_resize_kernels.h"
#include "decode/jpeg_decoder.h"

namespace gpupipe {

// One image of the batch: decoded HWC uint8 pixels of the output's channel count.
struct RaggedImage {
  uint64_t address = 0;
  int64_t height = 0, width = 0, pitch = 0;  // pitch: bytes between rows
};

// The images of an int64 [n, 4] table of (address, height, width, pitch) rows.
std::vector<RaggedImage> ragged_images(const std::vector<int64_t>& rows);

struct CropResizePlan {
  std::vector<CropResizeSample> samples;
  int64_t batch = 0, out_h = 0, out_w = 0, channels = 0;
  uint8_t* out = nullptr;
  // The scratch: the table, then each sample's coefficients and intermediate (16-byte aligned).
  uint64_t scratch_bytes = 0;
};

// Validates the batch and plans it; a bad argument is an InvalidArgument naming the sample. The
// output is uint8 [batch, out_h, out_w, channels] contiguous at out_address (out_nbytes bytes), in
// the images' memory space; channels is 1 or 3; slots are distinct, within the batch; boxes (top,
// left, height, width) are whole pixels inside their image. Without `resize` each box has the
// output's size (a copy) and `window` is ignored, as the CPU core does.
CropResizePlan plan_crop_resize(const std::vector<RaggedImage>& images, const std::vector<Box>& boxes,
                                const std::vector<int64_t>& slots, uintptr_t out_address, size_t out_nbytes,
                                int64_t batch, int64_t out_h, int64_t out_w, int64_t channels, bool resize,
                                bool window);

// Runs a plan of host images on the thread pool of num_threads (0: the default; InvalidArgument
// outside 0..kMaxThreads): the coefficients, the first pass, then the second, each one parallel loop
// over all samples' rows, as the kernels run.
void crop_resize_host(const CropResizePlan& plan, int num_threads);

}  // namespace gpupipe
