#include "decode/header_table.h"

#include <cstring>

namespace gpupipe {
namespace {

// SOS markers in a file (a scan bomb, progressive or not, has thousands); FF DA cannot occur inside
// entropy-coded data (FF is stuffed), so counting marker pairs counts scans.
int64_t count_scans(const uint8_t* d, size_t n) {
  int64_t scans = 0;
  for (size_t p = 0; p + 1 < n;) {
    const void* hit = std::memchr(d + p, 0xFF, n - p - 1);
    if (!hit) break;
    p = static_cast<const uint8_t*>(hit) - d;
    scans += d[p + 1] == 0xDA;
    ++p;
  }
  return scans;
}

// Whether the file ends with its EOI marker: a truncated file does not. GPU decoders decode such
// a file without a word, so the GPU backends leave it to the CPU core (which reports it).
int64_t ends_with_eoi(const uint8_t* d, size_t n) { return n >= 2 && d[n - 2] == 0xFF && d[n - 1] == 0xD9; }

constexpr size_t kHeight = info_column("height"), kWidth = info_column("width"),
                 kColorspace = info_column("colorspace"), kChannels = info_column("channels"),
                 kOrientation = info_column("orientation"), kProgressive = info_column("progressive"),
                 kScans = info_column("scans"), kEoi = info_column("eoi"), kError = info_column("error");

}  // namespace

int64_t* header_table_output(const std::vector<ByteSpan>& inputs, uintptr_t address, size_t given) {
  const size_t needed = checked_mul(inputs.size(), kInfoWidth * sizeof(int64_t), "the header table");
  if (address % alignof(int64_t)) throw InvalidArgument("the header table must be 8-byte aligned");
  return reinterpret_cast<int64_t*>(checked_output(address, needed, given, inputs));
}

std::vector<IndexedError> read_header_table(const std::vector<ByteSpan>& inputs, int64_t* out, bool scans) {
  std::vector<IndexedError> failures;
  Decoder& d = thread_decoder();
  for (size_t i = 0; i < inputs.size(); ++i) {
    int64_t* row = out + kInfoWidth * i;
    try {
      const JpegInfo info = d.read_header(inputs[i].data, inputs[i].size);
      row[kHeight] = info.height;
      row[kWidth] = info.width;
      row[kColorspace] = static_cast<int64_t>(info.colorspace);
      row[kChannels] = info.channels;
      row[kOrientation] = info.orientation;
      row[kProgressive] = info.progressive;
      // every file: a baseline file may also hold many scans (one component each). The whole file is
      // read for it (~12 us for 300 KB): only where a GPU decoder may take the file
      row[kScans] = scans ? count_scans(inputs[i].data, inputs[i].size) : -1;
      row[kEoi] = ends_with_eoi(inputs[i].data, inputs[i].size);
      row[kError] = static_cast<int64_t>(ErrorKind::kNone);
    } catch (const DecodeError& e) {
      for (size_t c = 0; c < kInfoWidth; ++c) row[c] = -1;
      row[kError] = static_cast<int64_t>(e.kind);
      failures.emplace_back(i, e.kind, e.what());
    }
  }
  return failures;
}

}  // namespace gpupipe
