// libFuzzer harness of the restart-marker index (csrc/decode/restart.cpp) with hostile marker layouts, no
// Python, under ASan + UBSan: the layout the caller believes (size, components, MCU size, interval)
// comes from the input, the bytes are anything. Whatever the walk accepts must give sub-JPEGs that
// stay inside their buffers, and the decoder must treat them as any other input. Input layout:
// 12 parameter bytes, then the file.
#include <cstdint>
#include <new>
#include <vector>

#include "common/errors.h"
#include "decode/jpeg_decoder.h"
#include "decode/restart.h"

using namespace gpupipe;

namespace {
int be16(const uint8_t* p) { return p[0] << 8 | p[1]; }
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  Limits limits;
  limits.max_pixels = 1u << 20;
  limits.max_memory = 128u << 20;
  set_limits(limits);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* input, size_t size) {
  if (size < 12) return 0;
  const uint8_t* p = input;
  const uint8_t* data = input + 12;
  const size_t n = size - 12;
  // The layout is usually the one libjpeg reads (so the walk is reached), sometimes a hostile guess.
  int width = be16(p), height = be16(p + 2), components = 1 + p[4] % 4;
  int mcu_w = 8 * (1 + p[5] % 2), mcu_h = 8 * (1 + p[6] % 2), interval = 1 + p[7] % 16;
  if (!(p[8] & 1)) {
    try {
      const JpegInfo info = thread_decoder().read_header(data, n);
      width = info.width;
      height = info.height;
      components = info.channels;
      if (info.restart_interval > 0) interval = info.restart_interval;
    } catch (const DecodeError&) {
    }
  }
  RestartLayout layout;
  if (!index_restarts(data, n, width, height, components, mcu_w, mcu_h, interval, &layout)) return 0;
  const int rows = layout.mcu_rows, groups = layout.groups_per_row;
  const int r0 = p[9] % rows, g0 = p[10] % groups;
  const int r1 = r0 + p[11] % (rows - r0), g1 = g0 + (p[11] >> 4) % (groups - g0);
  std::vector<uint8_t> sub;
  if (!build_sub_jpeg(data, n, layout, r0, r1, g0, g1, &sub)) return 0;
  // Out-of-range requests must be refused, never read out of bounds.
  std::vector<uint8_t> ignored;
  if (build_sub_jpeg(data, n, layout, r0, rows, g0, g1, &ignored) || build_sub_jpeg(data, n, layout, -1, r1, g0, g1, &ignored))
    __builtin_trap();
  try {
    const JpegInfo info = thread_decoder().read_header(sub.data(), sub.size());
    DecodeRequest req;
    req.box = Box{0, 0, static_cast<double>(info.height), static_cast<double>(info.width)};
    req.out_height = info.height;
    req.out_width = info.width;
    std::vector<uint8_t> out(static_cast<size_t>(info.height) * info.width * 3);
    thread_decoder().decode(sub.data(), sub.size(), req, out.data(), static_cast<size_t>(info.width) * 3);
  } catch (const DecodeError&) {
  } catch (const InvalidArgument&) {
  } catch (const std::bad_alloc&) {
  }
  return 0;
}
