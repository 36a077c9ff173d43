// ROI JPEG decoding over libjpeg-turbo: header probe, crop decode, DCT-scaled resized crop.
// Plain C++17: no Python, no torch. One Decoder per thread (see thread_decoder()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gpupipe {

struct EntropyIndexUse;

enum class ColorMode : int { kRGB = 0, kGray = 1 };

inline int channels_of(ColorMode mode) { return mode == ColorMode::kRGB ? 3 : 1; }

// The color space a JPEG is stored in (libjpeg's jpeg_color_space).
enum class ColorSpace : int { kGray = 0, kYCbCr = 1, kRGB = 2, kCMYK = 3, kYCCK = 4, kUnknown = 5 };

// Chroma subsampling of a 3-component file (or gray / other).
enum class Subsampling : int { k444 = 0, k422 = 1, k420 = 2, k440 = 3, k411 = 4, k410 = 5, kGray = 6, kOther = 7 };

// Process-wide resource limits, checked from the header before any large allocation.
struct Limits {
  uint64_t max_pixels = 89478485;     // Pillow's Image.MAX_IMAGE_PIXELS
  int max_scans = 100;                // progressive scans; a scan bomb is refused past this
  uint64_t max_memory = 1ull << 30;   // libjpeg's own working memory per decode, bytes
  uint64_t max_file_size = 1ull << 30;  // bytes of one sample read from a file or a tar member
  uint64_t max_batch_bytes = 4ull << 30;  // bytes of one batch's files read together (read_files)
};
Limits get_limits();
void set_limits(const Limits& limits);

// Throws DecodeError(kPixelLimit) when height x width exceeds max_pixels.
void check_pixel_limit(uint64_t height, uint64_t width);

struct JpegInfo {
  int height = 0;
  int width = 0;
  int channels = 0;
  ColorSpace colorspace = ColorSpace::kUnknown;
  Subsampling subsampling = Subsampling::kOther;
  bool progressive = false;
  bool arithmetic = false;
  int orientation = 1;      // EXIF orientation 1..8, 1 when absent or unreadable
  int restart_interval = 0; // MCUs between restart markers, 0 when none
  int precision = 8;
};

// A window in the image's pixel coordinates. Crops (no resize) need whole pixels; a resized
// window may be fractional: it is resampled from the exact box, as Pillow's resize(box=...) does.
struct Box {
  double top = 0, left = 0, height = 0, width = 0;
};

// "(top=.., left=.., height=.., width=..)": how error messages name a box.
std::string describe(const Box& b);
// Every field is a whole number (a crop without resampling needs whole pixels).
bool whole_box(const Box& b);
// The box is finite, non-empty and inside a frame_h x frame_w frame (no sum that could overflow).
bool box_inside(const Box& b, int64_t frame_h, int64_t frame_w);

struct DecodeRequest {
  Box box;
  // Output size. Without `resize` it must equal the box size.
  int out_height = 0, out_width = 0;
  bool resize = false;       // resize the box to the output size (antialiased bilinear, as Pillow)
  bool dct_scaling = true;   // with resize: decode already downscaled by M/8 when the box is >= 2x
  bool window = false;       // with resize: the box is a window of the whole image resized (Pillow's
                             // resize(box=...), torchvision's Resize + CenterCrop): the filter reads
                             // pixels around the box too. Else the box is cropped first, then
                             // resized (torchvision's resized_crop, RandomResizedCrop).
  int force_scale_num = 0;   // 1..8: decode at exactly this M/8; 0: choose
  bool scaled_box = false;   // with force_scale_num: the box is in the scaled frame, no resize
                             // (the exact intermediate, for tests against a scaled full decode)
  ColorMode mode = ColorMode::kRGB;
  bool strict = false;       // libjpeg warnings (corrupt or truncated data) become errors
  bool use_restarts = true;  // decode only the crop's restart intervals when the file allows it
  EntropyIndexUse* entropy = nullptr;  // the entropy index's rows of this file (entropy_index.h), or none
};

struct DecodeResult {
  std::string warning;  // first libjpeg warning when not strict, else empty
  int scale_num = 8;    // the DCT scale M/8 used
  bool restart_path = false;  // decoded from the crop's restart intervals only (see restart.h)
};

// Chooses the DCT scale M (of M/8) for resizing a box to an output size: the smallest M in
// 1..4 whose scaled box still covers the output, used only when the box is >= 2x the output on
// both sides; 8 (no scaling) otherwise. Safe for any int64 inputs.
int choose_scale_num(int64_t box_h, int64_t box_w, int out_h, int out_w);

// The EXIF orientation (1..8) in an APP1 payload, as Pillow reads the tag and exif_transpose
// applies it (its first value, of any numeric type, equal to one of 2..8): 0 when the payload is
// not "Exif", kNoOrientationTag when its first IFD has no Orientation tag, 1 when it is malformed
// or orients nothing. Checks every offset against the payload's length.
inline constexpr int kNoOrientationTag = -1;
int exif_orientation(const uint8_t* payload, size_t size);

// The digit after the first `tiff:Orientation="` or `tiff:Orientation>` of an XMP APP1 payload
// (Pillow's pattern): 0..9; kNotXmp when the payload is not XMP, kNoOrientationTag without one.
inline constexpr int kNotXmp = -2;
int xmp_orientation(const uint8_t* payload, size_t size);

class Decoder {
 public:
  Decoder();
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // Parses the headers only (no entropy decoding). Throws DecodeError.
  JpegInfo read_header(const uint8_t* data, size_t size);

  // Decodes the request's box into `out` as out_height x out_width x channels_of(mode) uint8
  // rows of `out_stride` bytes. Throws InvalidArgument (bad box), DecodeError (libjpeg's message,
  // or a limit). On throw, `out` may be partly written.
  DecodeResult decode(const uint8_t* data, size_t size, const DecodeRequest& request, uint8_t* out,
                      size_t out_stride);

  struct State;

 private:
  std::unique_ptr<State> state_;
};

// The calling thread's decoder, created on first use and destroyed when the thread exits.
Decoder& thread_decoder();

// The libjpeg this core is built with: LIBJPEG_TURBO_VERSION_NUMBER, JPEG_LIB_VERSION, and libjpeg's
// message formats (so that libjpeg text printed by another library, DALI's bundled libjpeg-turbo,
// can be recognised and kept off stderr).
int libjpeg_turbo_version();
int jpeg_lib_version();
std::vector<std::string> libjpeg_message_formats();

}  // namespace gpupipe
