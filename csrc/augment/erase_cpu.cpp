#include "augment/erase_cpu.h"

#include <cstring>
#include <string>

#include "common/errors.h"
#include "common/multiversion.h"
#include "common/strided_buffer.h"
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

EraseArgs erase_args(const std::vector<int64_t>& images, const std::vector<int64_t>& boxes,
                     const std::vector<int64_t>& values) {
  const int type = images.size() > 2 ? static_cast<int>(images[2]) : -1;
  if (type == kInt64 || elem_size(type) == 0)
    throw InvalidArgument("x: must be uint8, float32, bfloat16, float16 or float64");
  const StridedBuffer x = parse_buffer(images, "x", type, {-1, -1, -1, -1});
  const int64_t n = x.shape[0], c = x.shape[1], h = x.shape[2], w = x.shape[3];
  const StridedBuffer b = parse_buffer(boxes, "boxes", kInt64, {n, 4});
  const StridedBuffer v = parse_buffer(values, "values", x.type, {c});
  require_contiguous(b, "boxes");
  require_contiguous(v, "values");
  check_disjoint(x, "x", b, "boxes");
  check_disjoint(x, "x", v, "values");
  const int64_t* box = b.as<const int64_t>();
  for (int64_t i = 0; i < n; ++i)  // an erased box must lie inside its image (overflow-free compares)
    if (box[4 * i + 2] > 0 && (box[4 * i] < 0 || box[4 * i + 1] < 0 || box[4 * i + 3] < 0 || box[4 * i] > h ||
                               box[4 * i + 1] > w || box[4 * i + 2] > h - box[4 * i] ||
                               box[4 * i + 3] > w - box[4 * i + 1]))
      throw InvalidArgument("boxes[" + std::to_string(i) + "] is not inside the " + std::to_string(h) + "x" +
                            std::to_string(w) + " image");
  EraseArgs a;
  a.data = x.as<uint8_t>();
  a.n = n;
  a.c = c;
  a.h = h;
  a.w = w;
  for (int d = 0; d < 4; ++d) a.stride[d] = x.strides[d];
  a.elem_size = elem_size(x.type);
  a.boxes = box;
  a.values = v.as<const uint8_t>();
  return a;
}

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
