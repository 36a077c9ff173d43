// Restart markers as random access into the entropy-coded data.
//
// A baseline JPEG whose restart intervals are aligned with MCU rows (the interval divides the MCUs
// per row) can be cut: the intervals covering an MCU-aligned rectangle, renumbered RST0..7 and put
// behind the original headers with the rectangle's size in SOF, form a valid JPEG whose pixels are
// those of the rectangle (the DC predictors restart at every interval). Decoding it touches only
// the rectangle's MCUs: the entropy floor of the rows above and the columns beside the crop is gone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gpupipe {

struct RestartLayout {
  int width = 0, height = 0;          // image size in pixels
  int mcu_width = 0, mcu_height = 0;  // pixels
  int mcus_per_row = 0, mcu_rows = 0;
  int interval = 0;                   // MCUs per restart interval (divides mcus_per_row)
  int groups_per_row = 0;             // intervals per MCU row
  size_t sof_offset = 0;              // offset of the SOF marker (FF Cn)
  size_t scan_offset = 0;             // first entropy-coded byte
  std::vector<size_t> starts;         // entropy data of interval i: [starts[i], ends[i])
  std::vector<size_t> ends;
};

// Fills `layout` when the file is a single-scan baseline Huffman JPEG with intact, correctly
// numbered restart markers aligned with MCU rows. Returns false otherwise (use the normal path).
// Header fields come from libjpeg (already parsed by the caller); the marker walk must find the
// same frame (size and components) in segments whose lengths are checked against the buffer and
// against their content (SOF: 8 + 3 Nf bytes, SOS: 6 + 2 Ns), standalone markers (RSTn, TEM)
// having no length, or it returns false.
bool index_restarts(const uint8_t* data, size_t size, int width, int height, int components, int mcu_width,
                    int mcu_height, int restart_interval, RestartLayout* layout);

// The synthetic JPEG of MCU rows [row0, row1] x interval groups [group0, group1]. Returns false
// (out unspecified) when the ranges or the layout do not fit `data` (size bytes).
bool build_sub_jpeg(const uint8_t* data, size_t size, const RestartLayout& layout, int row0, int row1, int group0,
                    int group1, std::vector<uint8_t>* out);

// Lossless transcode (jpegtran -restart): identical DCT coefficients, Huffman tables optimised,
// baseline sequential, APPn and COM markers kept. Restart intervals: the largest divisor of the
// MCUs per row within [restart_mcus / 2, restart_mcus] (crops then skip columns too), else one
// interval per `restart_rows` MCU rows (restart_mcus = 0: always rows). The limits hold as in the
// decoder (max_pixels before any allocation, max_scans, max_memory), and a source with any libjpeg
// warning (corrupt or truncated data) is refused, never rewritten into a clean-looking file.
// Throws DecodeError (its kind says why) or InvalidArgument.
std::vector<uint8_t> transcode_with_restarts(const uint8_t* data, size_t size, int restart_rows,
                                             int restart_mcus);

}  // namespace gpupipe
