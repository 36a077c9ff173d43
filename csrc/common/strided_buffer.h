// Buffer validation of the kernels' entry points, shared by gpupipe._C and gpupipe._C_cuda (no
// Python here): a tensor reaches a binding as plain integers, [address, extent, type, ndim, shape...,
// strides...] (extent: the bytes of its storage from the address on; strides in elements), and is
// validated here before the GIL is released and before any kernel runs: type, shape, non-negative
// strides, every reachable element inside the extent (overflow-checked), alignment, contiguity where
// a kernel needs it, and no overlap between outputs and inputs.
#pragma once

#include <stdint.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "common/elem_type.h"
#include "common/errors.h"

namespace gpupipe {

struct StridedBuffer {
  uintptr_t address = 0;
  int64_t extent = 0;  // bytes reachable from address
  int type = -1;       // ElemType
  int ndim = 0;
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t strides[4] = {0, 0, 0, 0};  // elements
  int64_t span = 0;  // bytes from address to one past the last reachable element (0 when empty)

  template <typename T>
  T* as() const { return reinterpret_cast<T*>(address); }
  bool empty() const {
    for (int i = 0; i < ndim; ++i)
      if (shape[i] == 0) return true;
    return false;
  }
};

// Parses and validates one buffer: `name` is the argument named in the errors; `type` the element
// type it must have; `shape` the sizes it must have (-1: any size).
inline StridedBuffer parse_buffer(const std::vector<int64_t>& v, const char* name, int type,
                                  std::initializer_list<int64_t> shape) {
  auto fail = [&](const std::string& why) { throw InvalidArgument(std::string(name) + ": " + why); };
  if (v.size() < 4) fail("malformed buffer description");
  StridedBuffer b;
  b.address = static_cast<uintptr_t>(v[0]);
  b.extent = v[1];
  b.type = static_cast<int>(v[2]);
  b.ndim = static_cast<int>(v[3]);
  if (b.ndim < 1 || b.ndim > 4 || v.size() != static_cast<size_t>(4 + 2 * b.ndim))
    fail("malformed buffer description");
  if (b.type != type)
    fail(std::string("must be ") + elem_name(type) + ", got " + elem_name(b.type));
  if (static_cast<int>(shape.size()) != b.ndim)
    fail("must have " + std::to_string(shape.size()) + " dimensions, got " + std::to_string(b.ndim));
  int i = 0;
  for (int64_t want : shape) {
    b.shape[i] = v[4 + i];
    b.strides[i] = v[4 + b.ndim + i];
    if (b.shape[i] < 0 || b.strides[i] < 0) fail("negative size or stride");
    if (want >= 0 && b.shape[i] != want)
      fail("dimension " + std::to_string(i) + " must be " + std::to_string(want) + ", got " +
           std::to_string(b.shape[i]));
    ++i;
  }
  if (b.extent < 0) fail("negative extent");
  const int64_t size = elem_size(b.type);
  if (b.empty()) return b;
  if (b.address == 0) fail("null address");
  if (b.address % static_cast<uintptr_t>(size) != 0) fail("address is not aligned to its element size");
  int64_t last = 0;  // offset of the last reachable element, in elements
  for (int d = 0; d < b.ndim; ++d) {
    int64_t step;
    if (__builtin_mul_overflow(b.shape[d] - 1, b.strides[d], &step) || __builtin_add_overflow(last, step, &last))
      fail("sizes and strides overflow");
  }
  if (__builtin_add_overflow(last, 1, &last) || __builtin_mul_overflow(last, size, &b.span))
    fail("sizes and strides overflow");
  if (b.span > b.extent)
    fail("sizes and strides reach " + std::to_string(b.span) + " bytes, the buffer holds " +
         std::to_string(b.extent));
  return b;
}

inline void require_contiguous(const StridedBuffer& b, const char* name) {
  for (int d = 0; d < b.ndim; ++d)
    if (b.shape[d] == 0) return;  // no elements: any strides (numpy gives an empty array zero strides)
  int64_t expected = 1;
  for (int d = b.ndim - 1; d >= 0; --d) {
    if (b.shape[d] != 1 && b.strides[d] != expected) throw InvalidArgument(std::string(name) + " must be contiguous");
    expected *= b.shape[d];
  }
}

// Throws unless the byte ranges [address, address + span) of an output and another buffer are
// disjoint (an output overlapping an input would be read after it was written).
inline void check_disjoint(const StridedBuffer& out, const char* out_name, const StridedBuffer& other,
                           const char* other_name) {
  if (out.span == 0 || other.span == 0) return;
  const uintptr_t a0 = out.address, a1 = out.address + static_cast<uintptr_t>(out.span);
  const uintptr_t b0 = other.address, b1 = other.address + static_cast<uintptr_t>(other.span);
  if (a0 < b1 && b0 < a1)
    throw InvalidArgument(std::string(out_name) + " overlaps " + other_name +
                          " in memory: pass a separate output buffer");
}

}  // namespace gpupipe
