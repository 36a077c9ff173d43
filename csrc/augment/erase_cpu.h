// Host kernel of RandomErasing: each erased sample's box set to one value per channel, in place, in a
// batch of any element type and strides. Only the boxes' elements are touched.
#pragma once

#include <stdint.h>

namespace gpupipe {

struct EraseArgs {
  uint8_t* data = nullptr;               // [n, c, h, w]
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t stride[4] = {0, 0, 0, 0};      // elements
  int64_t elem_size = 0;                 // bytes
  const int64_t* boxes = nullptr;        // [n][4] top, left, height, width (height 0: not erased)
  const uint8_t* values = nullptr;       // [c] elements of the batch's type
};

void erase_boxes_cpu(const EraseArgs& args, int num_threads);

}  // namespace gpupipe
