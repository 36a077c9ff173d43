// libFuzzer harness of the lossless restart-marker transcoder (gpupipe.prepare), no Python, under
// ASan + UBSan: transcode, then verify what prepare promises. A source the transcoder accepts must
// decode to exactly the pixels of its transcoded copy (identical coefficients), and crops of the
// copy must be the same through the restart-marker route and the normal route. Input layout: 2
// parameter bytes (restart rows, target MCUs per interval), then the file.
#include <cstdint>
#include <cstdio>
#include <new>
#include <vector>

#include "common/errors.h"
#include "decode/huffman_reader.h"
#include "decode/jpeg_decoder.h"
#include "decode/restart.h"

using namespace gpupipe;

namespace {

// The whole image (rgb), or false when the decoder refuses it for a reason the transcoder does
// not share (an unsupported color conversion).
bool full_decode(const uint8_t* data, size_t n, bool use_restarts, const JpegInfo& info, std::vector<uint8_t>* out) {
  DecodeRequest req;
  req.box = Box{0, 0, static_cast<double>(info.height), static_cast<double>(info.width)};
  req.out_height = info.height;
  req.out_width = info.width;
  req.strict = true;
  req.use_restarts = use_restarts;
  out->assign(static_cast<size_t>(info.height) * info.width * 3, 0);
  try {
    thread_decoder().decode(data, n, req, out->data(), static_cast<size_t>(info.width) * 3);
  } catch (const DecodeError& e) {
    if (e.kind == ErrorKind::kUnsupported || is_limit(e.kind)) return false;
    std::fprintf(stderr, "strict decode failed after the transcoder accepted the file: %s\n", e.what());
    __builtin_trap();  // the transcoder accepted it, so a strict decode must too
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  Limits limits;
  limits.max_pixels = 1u << 20;
  limits.max_scans = 100;
  limits.max_memory = 256u << 20;
  set_limits(limits);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* input, size_t size) {
  if (size < 2) return 0;
  const int rows = 1 + input[0] % 4, mcus = input[1] % 12;
  const uint8_t* data = input + 2;
  const size_t n = size - 2;
  std::vector<uint8_t> prepared;
  try {
    prepared = transcode_with_restarts(data, n, rows, mcus);
  } catch (const DecodeError&) {
    return 0;
  } catch (const InvalidArgument&) {
    return 0;
  } catch (const std::bad_alloc&) {
    return 0;
  }
  JpegInfo a, b;
  try {
    a = thread_decoder().read_header(data, n);
    b = thread_decoder().read_header(prepared.data(), prepared.size());
  } catch (const DecodeError&) {
    __builtin_trap();  // both were just read by the transcoder / written by it
  }
  if (a.height != b.height || a.width != b.width || b.restart_interval == 0 || b.progressive) __builtin_trap();
  std::vector<uint8_t> src, dst, dst_slow;
  // The source as the transcoder reads it: libjpeg alone. gpupipe's Huffman reader may warn "bad
  // Huffman code" where libjpeg does not on damaged data near libjpeg's careful-decoder switch, pixels
  // identical (docs/semantics.md); the copy has restart markers, which the reader never takes.
  const bool reader = set_huffman_reader(false);
  const bool decoded = full_decode(data, n, true, a, &src);
  set_huffman_reader(reader);
  if (!decoded) return 0;
  if (!full_decode(prepared.data(), prepared.size(), true, b, &dst)) __builtin_trap();
  if (!full_decode(prepared.data(), prepared.size(), false, b, &dst_slow)) __builtin_trap();
  if (src != dst || dst != dst_slow) __builtin_trap();  // lossless, and both routes agree
  return 0;
}
