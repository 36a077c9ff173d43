// Inputs of the bindings through the buffer protocol, read without a copy.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "decode/decode_args.h"

namespace gpupipe {

// A contiguous read-only view of any object exporting the buffer protocol, released on scope exit.
class BufferView {
 public:
  explicit BufferView(PyObject* obj, int flags = PyBUF_SIMPLE) {
    if (PyObject_GetBuffer(obj, &view_, flags) != 0) throw pybind11::error_already_set();
    held_ = true;
  }
  BufferView(BufferView&& other) noexcept : view_(other.view_), held_(other.held_) { other.held_ = false; }
  BufferView(const BufferView&) = delete;
  ~BufferView() {
    if (held_) PyBuffer_Release(&view_);
  }
  const uint8_t* data() const { return static_cast<const uint8_t*>(view_.buf); }
  size_t size() const { return static_cast<size_t>(view_.len); }
  const Py_buffer& view() const { return view_; }
  ByteSpan span() const { return ByteSpan{data(), size()}; }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

// Views of a sequence's items, in order (TypeError where one is not bytes-like).
inline std::vector<BufferView> buffer_views(pybind11::sequence items) {
  const size_t n = pybind11::len(items);
  std::vector<BufferView> views;
  views.reserve(n);
  for (size_t i = 0; i < n; ++i) views.emplace_back(items[i].ptr());
  return views;
}

inline std::vector<ByteSpan> spans_of(const std::vector<BufferView>& views) {
  std::vector<ByteSpan> spans;
  spans.reserve(views.size());
  for (const BufferView& v : views) spans.push_back(v.span());
  return spans;
}

}  // namespace gpupipe
