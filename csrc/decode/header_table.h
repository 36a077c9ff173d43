// Headers as the bindings report them: the names of the header enums, and a batch's headers read
// into one int64 table (the Loader's plan stage reads every header of a batch in one call).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <vector>

#include "common/errors.h"
#include "decode/decode_args.h"
#include "decode/jpeg_decoder.h"

namespace gpupipe {

// Names of the header enums, index = the enum's value (exported as _C.COLORSPACES / SUBSAMPLINGS).
inline constexpr const char* kColorSpaceNames[] = {"gray", "ycbcr", "rgb", "cmyk", "ycck", "unknown"};
inline constexpr const char* kSubsamplingNames[] = {"4:4:4", "4:2:2", "4:2:0", "4:4:0",
                                                    "4:1:1", "4:1:0", "gray",  "other"};
static_assert(std::size(kColorSpaceNames) == static_cast<size_t>(ColorSpace::kUnknown) + 1, "a color space has no name");
static_assert(std::size(kSubsamplingNames) == static_cast<size_t>(Subsampling::kOther) + 1, "a subsampling has no name");
inline const char* colorspace_name(ColorSpace c) { return kColorSpaceNames[static_cast<int>(c)]; }
inline const char* subsampling_name(Subsampling s) { return kSubsamplingNames[static_cast<int>(s)]; }

// Columns of a header table row (exported as _C.INFO_COLUMNS). Where a header cannot be read,
// height..malformed are -1 and `error` is its ErrorKind. `trailing`: the bytes after the EOI marker
// that ends the JPEG (0 for most files), -1 without one (truncated); `malformed`: the bits below
// (header_table.cpp), 0 for most files; both -1 where scans were not counted.
inline constexpr const char* kInfoColumns[] = {"height", "width", "colorspace", "channels", "orientation",
                                               "progressive", "scans", "trailing", "malformed", "error"};
inline constexpr size_t kInfoWidth = std::size(kInfoColumns);

// The `malformed` column's bits (exported as _C.MALFORMED_LAYOUT, _C.FINER_CHROMA).
inline constexpr int64_t kMalformedLayout = 1;  // a marker layout libjpeg reads only with a warning or an error
inline constexpr int64_t kFinerChroma = 2;      // (valid) a component sampled more finely than the first one

// A column's index by name; consteval in effect: every call names a constant (a name that is not a
// column then fails to compile).
constexpr size_t info_column(const char* name) {
  for (size_t c = 0; c < kInfoWidth; ++c) {
    const char* a = kInfoColumns[c];
    const char* b = name;
    while (*a && *a == *b) ++a, ++b;
    if (*a == *b) return c;
  }
  throw "no such header-table column";
}

// The table's memory at `address` (`given` bytes): checked to hold inputs.size() rows, 8-byte
// aligned, apart from every input.
int64_t* header_table_output(const std::vector<ByteSpan>& inputs, uintptr_t address, size_t given);

// Reads every header into `out` (row i: inputs[i]) with the calling thread's decoder; returns the
// unreadable ones, (index, kind, message). Without `scans`, the scans, trailing and malformed columns
// are -1 (not counted: the CPU core enforces max_scans as it decodes; gpu_eligible() refuses such a row).
std::vector<IndexedError> read_header_table(const std::vector<ByteSpan>& inputs, int64_t* out, bool scans = true);

}  // namespace gpupipe
