// libFuzzer harness over the C++ decode core, no Python: header probe, crop decode (boxes, modes,
// DCT scales and resizes derived from the input, fractional boxes), the batch engine on the pool,
// the restart-marker index and the sub-JPEG it builds, the entropy index (a box decoded again from the rows
// learned must give the same pixels), the header table's marker walk. Built with ASan + UBSan by csrc/fuzz/run.sh.
// Input layout: 8 parameter bytes, then the file.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "decode/batch_decode.h"
#include "common/errors.h"
#include "decode/entropy_index.h"
#include "decode/header_table.h"
#include "decode/jpeg_decoder.h"
#include "decode/restart.h"
#include "decode/scaled_idct.h"

using namespace gpupipe;

namespace {
uint32_t pick(uint8_t byte, uint32_t n) { return n ? byte % n : 0; }
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  Limits limits;
  limits.max_pixels = 4u << 20;  // keep single inputs fast; the limit path itself is exercised
  limits.max_scans = 100;
  limits.max_memory = 256u << 20;
  set_limits(limits);
  set_entropy_index_bytes(16u << 20);  // bounded as in a process; a full index decodes as without it
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* input, size_t size) {
  if (size < 8) return 0;
  const uint8_t* p = input;
  const uint8_t* data = input + 8;
  const size_t n = size - 8;
  Decoder& decoder = thread_decoder();
  JpegInfo info;
  try {
    info = decoder.read_header(data, n);
  } catch (const DecodeError&) {
    return 0;
  }
  if (info.height < 1 || info.width < 1) __builtin_trap();  // libjpeg must reject empty images

  DecodeRequest req;
  const int top = pick(p[0], info.height), left = pick(p[1], info.width);
  req.box = Box{static_cast<double>(top), static_cast<double>(left), 1.0 + pick(p[2], info.height - top),
                1.0 + pick(p[3], info.width - left)};
  req.mode = (p[4] & 1) ? ColorMode::kGray : ColorMode::kRGB;
  req.strict = (p[4] & 2) != 0;
  req.use_restarts = (p[4] & 4) == 0;
  req.resize = (p[4] & 8) != 0;
  req.dct_scaling = (p[4] & 16) != 0;
  req.out_height = req.resize ? 1 + pick(p[5], 48) : static_cast<int>(req.box.height);
  req.out_width = req.resize ? 1 + pick(p[6], 48) : static_cast<int>(req.box.width);
  if (req.resize && (p[7] & 1)) {  // a fractional window, as ResizeCenterCrop makes
    req.box.top += (p[5] & 7) / 8.0;
    req.box.height = std::max(0.125, req.box.height - (p[6] & 7) / 4.0);
    req.window = (p[7] & 4) != 0;  // resampled with the filter's reach around it
  }
  const int channels = channels_of(req.mode);
  const size_t stride = static_cast<size_t>(req.out_width) * channels;
  std::vector<uint8_t> out;
  DecodeResult first;
  bool decoded = false;
  try {
    out.resize(static_cast<size_t>(req.out_height) * stride);
    first = decoder.decode(data, n, req, out.data(), stride);  // (without the entropy index)
    decoded = true;
  } catch (const InvalidArgument&) {
  } catch (const DecodeError&) {
  } catch (const std::bad_alloc&) {
  }

  // The header table's marker walk (scans, the bytes after the EOI a GPU decoder is not given): an
  // EOI it reports is one, inside the data.
  {
    const std::vector<ByteSpan> inputs{ByteSpan{data, n}};
    int64_t row[kInfoWidth];
    if (read_header_table(inputs, row, true).empty()) {
      const int64_t trailing = row[info_column("trailing")];
      if (row[info_column("scans")] < 0 || trailing < -1 || trailing > static_cast<int64_t>(n) - 4) __builtin_trap();
      if (trailing >= 0 && (data[n - trailing - 2] != 0xFF || data[n - trailing - 1] != 0xD9)) __builtin_trap();
    }
  }

  // The batch engine on the calling thread: the same file twice, a second box from p[7].
  std::vector<BatchSample> samples(2);
  for (auto& s : samples) {
    s.data = data;
    s.size = n;
    s.box = req.box;
  }
  samples[1].box.top = pick(p[7], info.height);
  samples[1].box.height = 1 + pick(p[7] >> 1, info.height - static_cast<int>(samples[1].box.top));
  samples[1].box.width = 1;
  BatchOptions opt;
  opt.request.out_height = 8;
  opt.request.out_width = 8;
  opt.request.resize = true;
  opt.request.mode = req.mode;
  std::vector<uint8_t> batch(2 * 8 * 8 * channels);
  static ThreadPool pool(2);  // the engine's parallel path, as the bindings run it
  decode_batch(p[7] & 2 ? &pool : nullptr, samples, opt, batch.data());

  // The entropy index: the first box again, from the rows the decodes above learned (twice: the
  // second from what the first learned), the same pixels and warning as without it. The second
  // runs libjpeg's own 3x3 and 6x6 IDCTs: the AVX2 kernels (scaled_idct.h) must have given their bits.
  if (decoded) {
    for (int k = 0; k < 2; ++k) {
      std::vector<uint8_t> again(out.size());
      DecodeResult r;
      const bool kernels = set_vector_idcts(k == 0);
      try {
        r = decode_indexed(data, n, req, again.data(), stride);
      } catch (const std::bad_alloc&) {
        set_vector_idcts(kernels);
        break;
      } catch (...) {
        __builtin_trap();  // it decoded without the index
      }
      set_vector_idcts(kernels);
      if (again != out || r.warning != first.warning || r.scale_num != first.scale_num) __builtin_trap();
    }
  }

  if (info.restart_interval > 0) {
    RestartLayout layout;
    const int hmax = p[5] % 2 + 1, vmax = p[6] % 2 + 1;  // any layout guess must be safe
    if (index_restarts(data, n, info.width, info.height, info.channels, 8 * hmax, 8 * vmax, info.restart_interval,
                       &layout)) {
      std::vector<uint8_t> sub;
      const int r0 = pick(p[0], layout.mcu_rows), g0 = pick(p[1], layout.groups_per_row);
      if (build_sub_jpeg(data, n, layout, r0, r0 + pick(p[2], layout.mcu_rows - r0), g0,
                         g0 + pick(p[3], layout.groups_per_row - g0), &sub)) {
        try {
          decoder.read_header(sub.data(), sub.size());
        } catch (const DecodeError&) {
        }
      }
    }
  }
  return 0;
}
