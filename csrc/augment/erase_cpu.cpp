#include "augment/erase_cpu.h"

#include <cstring>

#include "common/multiversion.h"
#include "common/thread_pool.h"

namespace gpupipe {
namespace {

// Fills count elements `step` elements apart with the element `value` (elem_size bytes).
template <typename T>
void fill_elements(uint8_t* start, int64_t count, int64_t step, const uint8_t* value) {
  T v;
  std::memcpy(&v, value, sizeof(T));
  T* p = reinterpret_cast<T*>(start);
  if (step == 1) {
    for (int64_t i = 0; i < count; ++i) p[i] = v;
  } else {
    for (int64_t i = 0; i < count; ++i) p[i * step] = v;
  }
}

// Run under dispatch() (multiversion.h): the fills are stored at the CPU's vector width.
inline void erase_sample(const EraseArgs& a, int64_t i) {
  const int64_t* box = a.boxes + 4 * i;
  const int64_t top = box[0], left = box[1], height = box[2], width = box[3];
  if (height <= 0 || width <= 0) return;
  for (int64_t c = 0; c < a.c; ++c)
    for (int64_t y = top, end = top + height; y < end; ++y) {  // the binding checked top + height <= h
      uint8_t* start = a.data + (i * a.stride[0] + c * a.stride[1] + y * a.stride[2] + left * a.stride[3]) * a.elem_size;
      const uint8_t* value = a.values + c * a.elem_size;
      switch (a.elem_size) {
        case 1: fill_elements<uint8_t>(start, width, a.stride[3], value); break;
        case 2: fill_elements<uint16_t>(start, width, a.stride[3], value); break;
        case 4: fill_elements<uint32_t>(start, width, a.stride[3], value); break;
        default: fill_elements<uint64_t>(start, width, a.stride[3], value);
      }
    }
}

}  // namespace

void erase_boxes_cpu(const EraseArgs& a, int num_threads) {
  if (num_threads <= 1 || a.n < 2) {
    dispatch([&](auto) {
      for (int64_t i = 0; i < a.n; ++i) erase_sample(a, i);
    });
    return;
  }
  get_pool(num_threads)->parallel_for(static_cast<size_t>(a.n), [&](size_t i) {
    dispatch([&](auto) { erase_sample(a, static_cast<int64_t>(i)); });
  });
}

}  // namespace gpupipe
