// Host kernel of RandomErasing: each erased sample's box set to one value per channel, in place, in a
// batch of any element type and strides. Only the boxes' elements are touched.
#pragma once

#include <stdint.h>

#include <vector>

namespace gpupipe {

struct EraseArgs {
  uint8_t* data = nullptr;               // [n, c, h, w]
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t stride[4] = {0, 0, 0, 0};      // elements
  int64_t elem_size = 0;                 // bytes
  const int64_t* boxes = nullptr;        // [n][4] top, left, height, width (height 0: not erased)
  const uint8_t* values = nullptr;       // [c] elements of the batch's type
};

// The launch arguments of erase_boxes from buffer descriptions (common/strided_buffer.h): x uint8 or
// floating point [N, C, H, W], any strides; boxes int64 [N, 4] and values [C] of x's type,
// contiguous; every erased box inside its image. Throws InvalidArgument naming the argument.
EraseArgs erase_args(const std::vector<int64_t>& images, const std::vector<int64_t>& boxes,
                     const std::vector<int64_t>& values);

void erase_boxes_cpu(const EraseArgs& args, int num_threads);

}  // namespace gpupipe
