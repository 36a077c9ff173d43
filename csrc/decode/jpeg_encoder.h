// A small libjpeg encoder exposing what Pillow cannot write (4:4:0 and 4:1:1 sampling,
// arithmetic coding, RGB-coded and YCCK files, restart markers), for test and benchmark data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gpupipe {

struct EncodeOptions {
  int quality = 90;
  int h_samp = 2, v_samp = 2;     // luma sampling factors; chroma is 1x1 (2x2 = 4:2:0)
  // Every component's (h, v) factors, 1..4 each, overriding h_samp / v_samp when not empty: any
  // sampling a baseline file may carry (Cb and Cr may differ, chroma may exceed luma).
  std::vector<std::pair<int, int>> sampling;
  std::string colorspace = "ycbcr";  // stored space: "ycbcr" | "rgb" | "gray" | "cmyk" | "ycck"
  bool progressive = false;
  bool arithmetic = false;
  bool optimize = false;
  int restart_rows = 0;    // a restart marker every N MCU rows
  int restart_blocks = 0;  // or every N MCUs (wins over rows when both are set)
};

// Throws InvalidArgument unless `size` bytes of pixels are height x width x channels.
void check_encode_input(size_t size, int height, int width, int channels);

// pixels: height x width x channels uint8 (3 = RGB input, 1 = gray, 4 = CMYK input).
std::vector<uint8_t> encode_jpeg(const uint8_t* pixels, int height, int width, int channels,
                                 const EncodeOptions& options);

}  // namespace gpupipe
