#include "decode/jpeg_decoder.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <vector>

#include <jpeglib.h>

#include "common/errors.h"
#include "decode/huffman_reader.h"
#include "decode/jpeg_error.h"
#include "decode/jpeg_segments.h"
#include "decode/resize.h"
#include "decode/restart.h"
#include "decode/scaled_idct.h"

namespace gpupipe {

// ---------------------------------------------------------------------------------------------
// Limits

namespace {
std::atomic<uint64_t> g_max_pixels{Limits{}.max_pixels};
std::atomic<int> g_max_scans{Limits{}.max_scans};
std::atomic<uint64_t> g_max_memory{Limits{}.max_memory};
std::atomic<uint64_t> g_max_file_size{Limits{}.max_file_size};
std::atomic<uint64_t> g_max_batch_bytes{Limits{}.max_batch_bytes};
}  // namespace

Limits get_limits() {
  Limits l;
  l.max_pixels = g_max_pixels.load();
  l.max_scans = g_max_scans.load();
  l.max_memory = g_max_memory.load();
  l.max_file_size = g_max_file_size.load();
  l.max_batch_bytes = g_max_batch_bytes.load();
  return l;
}

void set_limits(const Limits& l) {
  if (l.max_pixels == 0 || l.max_scans <= 0 || l.max_memory == 0 || l.max_file_size == 0 || l.max_batch_bytes == 0)
    throw InvalidArgument("limits must be positive");
  g_max_pixels = l.max_pixels;
  g_max_scans = l.max_scans;
  g_max_memory = l.max_memory;
  g_max_file_size = l.max_file_size;
  g_max_batch_bytes = l.max_batch_bytes;
}

void check_pixel_limit(uint64_t height, uint64_t width) {
  const uint64_t limit = g_max_pixels.load(std::memory_order_relaxed);
  if (height * width > limit)  // both < 2^16 in a JPEG: no overflow
    throw DecodeError(ErrorKind::kPixelLimit,
                      "image is " + std::to_string(width) + "x" + std::to_string(height) + " = " +
                          std::to_string(height * width) + " pixels, over the max_pixels limit of " +
                          std::to_string(limit) +
                          " (a possible decompression bomb; gpupipe.set_limits(max_pixels=...) raises it)");
}

int choose_scale_num(int64_t box_h, int64_t box_w, int out_h, int out_w) {
  if (out_h < 1 || out_w < 1) return 8;
  const int64_t oh = out_h, ow = out_w;
  if (box_h < 2 * oh || box_w < 2 * ow) return 8;
  // The smallest M with box * M / 8 >= out, compared without multiplying the (unbounded) box.
  for (int m = 1; m <= 4; ++m)
    if (box_h >= (8 * oh + m - 1) / m && box_w >= (8 * ow + m - 1) / m) return m;
  return 8;  // unreachable: m = 4 always covers a 2x box
}

// ---------------------------------------------------------------------------------------------
// EXIF

namespace {

uint32_t read_u16(const uint8_t* p, bool le) { return le ? p[0] | p[1] << 8 : p[0] << 8 | p[1]; }
uint32_t read_u32(const uint8_t* p, bool le) {
  return le ? p[0] | p[1] << 8 | p[2] << 16 | static_cast<uint32_t>(p[3]) << 24
            : static_cast<uint32_t>(p[0]) << 24 | p[1] << 16 | p[2] << 8 | p[3];
}

}  // namespace

namespace {

// The Orientation entry at t + e as Pillow's TIFF reader and exif_transpose take it: the entry's
// first value (Pillow warns of more and keeps the first), of a numeric type Pillow reads as numbers,
// oriented when it equals one of 2..8 (a rational 6/1 or a float 6.0 too: Python compares them
// equal); no value, bytes, text, or another value: 1.
int orientation_value(const uint8_t* t, size_t tn, uint64_t e, bool le) {
  static constexpr int kSize[13] = {0, 1, 1, 2, 4, 8, 1, 1, 2, 4, 8, 4, 8};  // by TIFF type
  const uint32_t type = read_u16(t + e + 2, le);
  const uint64_t count = read_u32(t + e + 4, le);
  // (BYTE and UNDEFINED read as bytes there, ASCII as text: no orientation)
  if (type == 0 || type > 12 || type == 1 || type == 2 || type == 7 || count == 0) return 1;
  const uint64_t bytes = count * kSize[type];
  uint64_t at = e + 8;  // the value itself, or where it is when it does not fit in 4 bytes
  if (bytes > 4) {
    at = read_u32(t + e + 8, le);
    if (at > tn || tn - at < static_cast<uint64_t>(kSize[type])) return 1;
  }
  const uint8_t* v = t + at;
  double value;
  switch (type) {
    case 6: value = static_cast<int8_t>(v[0]); break;
    case 3: value = read_u16(v, le); break;
    case 8: value = static_cast<int16_t>(read_u16(v, le)); break;
    case 4: value = read_u32(v, le); break;
    case 9: value = static_cast<int32_t>(read_u32(v, le)); break;
    case 5: case 10: {
      const uint32_t num = read_u32(v, le), den = read_u32(v + 4, le);
      if (den == 0) return 1;
      value = type == 5 ? static_cast<double>(num) / den
                        : static_cast<double>(static_cast<int32_t>(num)) / static_cast<int32_t>(den);
      break;
    }
    case 11: {
      const uint32_t bits = read_u32(v, le);
      float f;
      std::memcpy(&f, &bits, 4);
      value = f;
      break;
    }
    default: {
      const uint64_t bits = le ? (static_cast<uint64_t>(read_u32(v + 4, le)) << 32 | read_u32(v, le))
                               : (static_cast<uint64_t>(read_u32(v, le)) << 32 | read_u32(v + 4, le));
      std::memcpy(&value, &bits, 8);
    }
  }
  for (int o = 2; o <= 8; ++o)
    if (value == o) return o;
  return 1;
}

}  // namespace

int exif_orientation(const uint8_t* p, size_t n) {
  if (n < 6 || std::memcmp(p, "Exif\0\0", 6) != 0) return 0;
  if (n < 14) return 1;
  const uint8_t* t = p + 6;  // the TIFF header
  const size_t tn = n - 6;
  bool le;
  if (t[0] == 'I' && t[1] == 'I') le = true;
  else if (t[0] == 'M' && t[1] == 'M') le = false;
  else return 1;
  if (read_u16(t + 2, le) != 42) return 1;
  const uint64_t ifd = read_u32(t + 4, le);
  if (ifd > tn || tn - ifd < 2) return 1;
  const uint32_t count = read_u16(t + ifd, le);
  for (uint32_t i = 0; i < count; ++i) {
    const uint64_t e = ifd + 2 + 12ull * i;
    if (e > tn || tn - e < 12) break;
    if (read_u16(t + e, le) == 0x0112) return orientation_value(t, tn, e, le);
  }
  return kNoOrientationTag;
}

int xmp_orientation(const uint8_t* p, size_t n) {
  static constexpr char kXmp[] = "http://ns.adobe.com/xap/1.0/";  // then a NUL
  static constexpr char kTag[] = "tiff:Orientation";
  const size_t head = sizeof(kXmp);  // the name and its NUL
  if (n < head || std::memcmp(p, kXmp, head) != 0) return kNotXmp;
  const size_t tag = sizeof(kTag) - 1;
  // Pillow's search: tiff:Orientation(="|>)([0-9]), its first match in the packet
  for (size_t i = head; i + tag + 2 <= n; ++i) {
    if (std::memcmp(p + i, kTag, tag) != 0) continue;
    const uint8_t* q = p + i + tag;
    size_t at = 0;
    if (q[0] == '>') at = 1;
    else if (q[0] == '=' && q[1] == '"') at = 2;  // (q[1] is inside: the loop's bound)
    if (at && i + tag + at < n && q[at] >= '0' && q[at] <= '9') return q[at] - '0';
  }
  return kNoOrientationTag;
}

// ---------------------------------------------------------------------------------------------
// libjpeg glue. Errors longjmp back into the guarded_* functions below, each of which owns no
// destructible object, so no C++ destructor is ever skipped.

namespace {

// How decoded rows become output rows.
enum class Convert : int { kCopy, kCmykToRgb, kCmykToGray };

// What one decode does, decided from the header and the request before any pixel is decoded.
struct Plan {
  int scale_num = 8;          // libjpeg decodes at M/8
  J_COLOR_SPACE out_space = JCS_RGB;
  Convert convert = Convert::kCopy;
  int channels = 3;
  int x0 = 0, x1 = 0, y0 = 0, y1 = 0;  // whole pixels of the (scaled) frame covering the box
  double bx0 = 0, by0 = 0, bx1 = 0, by1 = 0;  // the exact box relative to (x0, y0), for resizing
  bool horizontal_first = true;  // the resampler's pass order (Resampler::pillow_horizontal_first)
  bool direct = true;         // decoded rows go straight to the output (no resize)
  uint8_t* dst = nullptr;     // where decoded rows go: the output, or the region to resize
  size_t dst_stride = 0;
  // Without `direct` and with kCopy, libjpeg writes its (margin-widened) rows straight into the
  // state's region (no copy); the box's pixels then start at region_offset, rows region_stride apart.
  bool rows_in_region = false;
  size_t region_offset = 0, region_stride = 0;
  uint64_t max_memory = 0;
  EntropyIndexUse* entropy = nullptr;  // the entropy index's rows of the file decoded (not of a sub-JPEG)
};

constexpr int kRowsPerRead = 16;

// Pillow's CMYK -> RGB (libImaging/Convert.c cmyk2rgb), on libjpeg's output, which for CMYK
// files holds Adobe-inverted values (Pillow reads every CMYK JPEG as "CMYK;I").
inline uint8_t muldiv255(int a, int b) {
  int t = a * b + 128;
  return static_cast<uint8_t>(((t >> 8) + t) >> 8);
}

inline void cmyk_to_rgb(const uint8_t* in, uint8_t* out) {
  const int nk = in[3];
  for (int c = 0; c < 3; ++c) {
    int v = nk - muldiv255(255 - in[c], nk);
    out[c] = static_cast<uint8_t>(v < 0 ? 0 : v);
  }
}

// Pillow's RGB -> L (ITU-R 601-2 luma, 16-bit fixed point).
inline uint8_t rgb_to_gray(const uint8_t* rgb) {
  return static_cast<uint8_t>((rgb[0] * 19595 + rgb[1] * 38470 + rgb[2] * 7471 + 0x8000) >> 16);
}

void emit_row(const JSAMPLE* in, uint8_t* out, int width, int comps, Convert convert) {
  switch (convert) {
    case Convert::kCopy:
      std::memcpy(out, in, static_cast<size_t>(width) * comps);
      break;
    case Convert::kCmykToRgb:
      for (int x = 0; x < width; ++x) cmyk_to_rgb(in + 4 * x, out + 3 * x);
      break;
    case Convert::kCmykToGray:
      for (int x = 0; x < width; ++x) {
        uint8_t rgb[3];
        cmyk_to_rgb(in + 4 * x, rgb);
        out[x] = rgb_to_gray(rgb);
      }
      break;
  }
}

}  // namespace

struct Decoder::State {
  jpeg_decompress_struct cinfo;
  JpegErrorMgr err;
  bool created = false;
  Resampler resampler;
  std::vector<uint8_t> region;  // the decoded window, before resizing
  HuffmanReader huffman;        // gpupipe's Huffman decoding (huffman_reader.h)
  RestartLayout restarts;       // restart-marker index of the current file
  std::vector<uint8_t> sub;     // the synthetic JPEG of the crop's restart intervals
};

namespace {

bool guarded_create(Decoder::State* s) {
  if (setjmp(s->err.jump)) return false;
  jpeg_create_decompress(&s->cinfo);
  return true;
}

bool guarded_read_header(Decoder::State* s, const uint8_t* data, size_t size) {
  if (setjmp(s->err.jump)) return false;
  jpeg_mem_src(&s->cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&s->cinfo, TRUE);
  return true;
}

// libjpeg-turbo before 3.0 sets a cropped component's downsampled_width without that component's own
// IDCT size (its ChangeLog, 3.0.0 item 4). DCT scaling gives a component a larger IDCT than luma's when
// that halves its upsampling (jdmaster.c), and where upsampling remains (4x2, 2x4, 4x4 luma, or mixed
// chroma factors) the upsampler then fills only part of each row: color conversion reads uninitialised
// memory, pixels differ from the scaled full decode and from call to call. This is 3.0's formula, the
// same value there. The margin below keeps every cropped width >= 3, so 2.1.5's upsampler re-init
// (widths < 2) never depends on the wrong value.
void fix_cropped_downsampled_widths(j_decompress_ptr cinfo) {
  for (int ci = 0; ci < cinfo->num_components; ++ci) {
    jpeg_component_info* comp = &cinfo->comp_info[ci];
    const long num = static_cast<long>(cinfo->output_width) * comp->h_samp_factor * comp->DCT_scaled_size;
    const long den = static_cast<long>(cinfo->max_h_samp_factor) * cinfo->min_DCT_scaled_size;
    comp->downsampled_width = static_cast<JDIMENSION>((num + den - 1) / den);
  }
}

// Decodes rows [y0, y1) x columns [x0, x1) of the scaled output frame into plan->dst, or with
// rows_in_region into s->region (setting region_offset and region_stride).
bool guarded_decode_rows(Decoder::State* s, Plan* plan) {
  j_decompress_ptr cinfo = &s->cinfo;
  if (setjmp(s->err.jump)) return false;
  cinfo->scale_num = static_cast<unsigned int>(plan->scale_num);
  cinfo->scale_denom = 8;
  cinfo->out_color_space = plan->out_space;
  cinfo->dct_method = JDCT_ISLOW;
  cinfo->do_fancy_upsampling = TRUE;
  cinfo->mem->max_memory_to_use = static_cast<long>(std::min<uint64_t>(plan->max_memory, LONG_MAX));
  jpeg_start_decompress(cinfo);

  // Fancy (triangle) chroma upsampling replicates the window's outermost chroma samples, so the
  // window's edge columns differ from a full decode. Widen the window by two chroma samples on
  // each side (jpeg_crop_scanline then aligns the left edge down to an iMCU) and trim.
  const int margin = 2 * cinfo->max_h_samp_factor;
  const JDIMENSION full_w = cinfo->output_width;
  JDIMENSION xoff = plan->x0 > margin ? static_cast<JDIMENSION>(plan->x0 - margin) : 0;
  JDIMENSION xend = std::min<JDIMENSION>(full_w, static_cast<JDIMENSION>(plan->x1 + margin));
  JDIMENSION cw = xend - xoff;
  if (xoff > 0 || cw < full_w) {
    jpeg_crop_scanline(cinfo, &xoff, &cw);
    fix_cropped_downsampled_widths(cinfo);
  }
  s->huffman.use_index(plan->entropy);
  s->huffman.install(cinfo, xoff, cw);  // gpupipe's Huffman reader where it qualifies (huffman_reader.h)
  use_vector_idcts(cinfo);              // the 3/8 scale's IDCTs in AVX2 (scaled_idct.h)
  if (plan->y0 > 0) {
    JDIMENSION skipped = jpeg_skip_scanlines(cinfo, static_cast<JDIMENSION>(plan->y0));
    if (skipped != static_cast<JDIMENSION>(plan->y0)) {
      std::snprintf(s->err.message, sizeof(s->err.message), "JPEG data ends before row %d", plan->y0);
      s->err.kind = ErrorKind::kCorrupt;
      return false;
    }
  }
  const int comps = cinfo->output_components;
  const size_t libjpeg_row = static_cast<size_t>(cw) * comps;
  const int col = plan->x0 - static_cast<int>(xoff);
  const int width = plan->x1 - plan->x0;
  JSAMPARRAY rows;
  JSAMPROW region_rows[kRowsPerRead];
  if (plan->rows_in_region) {
    s->region.resize(libjpeg_row * static_cast<size_t>(plan->y1 - plan->y0));
    plan->region_offset = static_cast<size_t>(col) * comps;
    plan->region_stride = libjpeg_row;
    rows = region_rows;
  } else {
    rows = (*cinfo->mem->alloc_sarray)(reinterpret_cast<j_common_ptr>(cinfo), JPOOL_IMAGE,
                                       static_cast<JDIMENSION>(libjpeg_row), kRowsPerRead);
  }
  int y = plan->y0;
  while (y < plan->y1) {
    JDIMENSION want = static_cast<JDIMENSION>(std::min(kRowsPerRead, plan->y1 - y));
    if (plan->rows_in_region)
      for (JDIMENSION r = 0; r < want; ++r)
        region_rows[r] = s->region.data() + static_cast<size_t>(y - plan->y0 + static_cast<int>(r)) * libjpeg_row;
    JDIMENSION got = jpeg_read_scanlines(cinfo, rows, want);
    if (got == 0) {
      std::snprintf(s->err.message, sizeof(s->err.message), "JPEG decoder produced no row %d", y);
      s->err.kind = ErrorKind::kCorrupt;
      return false;
    }
    if (!plan->rows_in_region)
      for (JDIMENSION r = 0; r < got; ++r)
        emit_row(rows[r] + static_cast<size_t>(col) * comps,
                 plan->dst + static_cast<size_t>(y - plan->y0 + static_cast<int>(r)) * plan->dst_stride,
                 width, comps, plan->convert);
    y += static_cast<int>(got);
  }
  return true;
}

struct AbortOnExit {  // returns the decompressor to its idle state whatever happens
  j_decompress_ptr cinfo;
  ~AbortOnExit() { jpeg_abort_decompress(cinfo); }
};

ColorSpace colorspace_of(J_COLOR_SPACE cs) {
  switch (cs) {
    case JCS_GRAYSCALE: return ColorSpace::kGray;
    case JCS_YCbCr: return ColorSpace::kYCbCr;
    case JCS_RGB: return ColorSpace::kRGB;
    case JCS_CMYK: return ColorSpace::kCMYK;
    case JCS_YCCK: return ColorSpace::kYCCK;
    default: return ColorSpace::kUnknown;
  }
}

Subsampling subsampling_of(const jpeg_decompress_struct& c) {
  if (c.num_components == 1) return Subsampling::kGray;
  const int h0 = c.comp_info[0].h_samp_factor, v0 = c.comp_info[0].v_samp_factor;
  const int h1 = c.comp_info[1].h_samp_factor, v1 = c.comp_info[1].v_samp_factor;
  for (int i = 2; i < c.num_components; ++i)
    if (c.comp_info[i].h_samp_factor != h1 || c.comp_info[i].v_samp_factor != v1) return Subsampling::kOther;
  if (h0 % h1 || v0 % v1) return Subsampling::kOther;
  const int h = h0 / h1, v = v0 / v1;
  if (h == 1 && v == 1) return Subsampling::k444;
  if (h == 2 && v == 1) return Subsampling::k422;
  if (h == 2 && v == 2) return Subsampling::k420;
  if (h == 1 && v == 2) return Subsampling::k440;
  if (h == 4 && v == 1) return Subsampling::k411;
  if (h == 4 && v == 2) return Subsampling::k410;
  return Subsampling::kOther;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

std::string describe(const Box& b) {
  char text[160];
  std::snprintf(text, sizeof(text), "(top=%.10g, left=%.10g, height=%.10g, width=%.10g)", b.top, b.left, b.height,
                b.width);
  return text;
}

bool whole_box(const Box& b) {
  auto whole = [](double v) { return v == std::floor(v); };
  return whole(b.top) && whole(b.left) && whole(b.height) && whole(b.width);
}

bool box_inside(const Box& b, int64_t frame_h, int64_t frame_w) {
  const bool finite = std::isfinite(b.top) && std::isfinite(b.left) && std::isfinite(b.height) && std::isfinite(b.width);
  return finite && b.height > 0 && b.width > 0 && b.top >= 0 && b.left >= 0 && b.top < frame_h && b.left < frame_w &&
         b.height <= static_cast<double>(frame_h) - b.top && b.width <= static_cast<double>(frame_w) - b.left;
}

namespace {

// Everything about a decode that the header and the request decide: validation, the DCT scale, the
// color conversion, the window of whole pixels to decode and the box within it.
Plan plan_decode(const jpeg_decompress_struct& c, const DecodeRequest& req) {
  const int64_t H = c.image_height, W = c.image_width;
  check_pixel_limit(static_cast<uint64_t>(H), static_cast<uint64_t>(W));
  const Box& b = req.box;
  if (req.force_scale_num && (req.force_scale_num < 1 || req.force_scale_num > 8))
    throw InvalidArgument("scale must be M/8 with M in 1..8");
  if (req.scaled_box && !req.force_scale_num) throw InvalidArgument("a box in the scaled frame needs a scale");
  Plan plan;
  if (req.force_scale_num) plan.scale_num = req.force_scale_num;
  // libjpeg scales the frame to ceil(W * M / 8) x ceil(H * M / 8).
  const int64_t sw = ceil_div(W * plan.scale_num, 8), sh = ceil_div(H * plan.scale_num, 8);
  const int64_t frame_w = req.scaled_box ? sw : W, frame_h = req.scaled_box ? sh : H;
  if (!box_inside(b, frame_h, frame_w))
    throw InvalidArgument("crop box " + describe(b) + " is not inside the image of " + std::to_string(frame_w) +
                          "x" + std::to_string(frame_h) + " (width x height)");
  if (req.out_height < 1 || req.out_width < 1) throw InvalidArgument("output size must be >= 1");
  const bool resample = req.resize && !req.scaled_box;
  if (!resample) {
    if (!whole_box(b))
      throw InvalidArgument("crop box " + describe(b) + " is fractional: only a resized box (size=...) may be");
    if (req.out_height != b.height || req.out_width != b.width)
      throw InvalidArgument("output size differs from the box size but resize is off");
    if (plan.scale_num != 8 && !req.scaled_box)
      throw InvalidArgument("a DCT-scaled decode needs resize or a box in the scaled frame");
  }
  if (resample && !req.force_scale_num && req.dct_scaling)
    plan.scale_num = choose_scale_num(static_cast<int64_t>(b.height), static_cast<int64_t>(b.width), req.out_height,
                                      req.out_width);
  const int64_t fw = ceil_div(W * plan.scale_num, 8), fh = ceil_div(H * plan.scale_num, 8);

  const bool rgb = req.mode == ColorMode::kRGB;
  if (c.jpeg_color_space == JCS_CMYK || c.jpeg_color_space == JCS_YCCK) {
    plan.out_space = JCS_CMYK;
    plan.convert = rgb ? Convert::kCmykToRgb : Convert::kCmykToGray;
  } else if (c.jpeg_color_space == JCS_GRAYSCALE || c.jpeg_color_space == JCS_YCbCr ||
             c.jpeg_color_space == JCS_RGB) {
    plan.out_space = rgb ? JCS_RGB : JCS_GRAYSCALE;
    plan.convert = Convert::kCopy;
  } else {
    throw DecodeError(ErrorKind::kUnsupported,
                      "unsupported JPEG color space with " + std::to_string(c.num_components) + " components");
  }
  plan.channels = channels_of(req.mode);
  plan.max_memory = g_max_memory.load(std::memory_order_relaxed);

  // The box in the scaled frame and the whole pixels that cover it. Scaled pixel j covers
  // full-resolution pixels [8j/M, 8(j+1)/M).
  const double k = req.scaled_box ? 1.0 : plan.scale_num / 8.0;
  const double fx0 = b.left * k, fx1 = (b.left + b.width) * k;
  const double fy0 = b.top * k, fy1 = (b.top + b.height) * k;
  plan.x0 = static_cast<int>(std::floor(fx0));
  plan.y0 = static_cast<int>(std::floor(fy0));
  plan.x1 = static_cast<int>(std::min<int64_t>(fw, static_cast<int64_t>(std::ceil(fx1))));
  plan.y1 = static_cast<int>(std::min<int64_t>(fh, static_cast<int64_t>(std::ceil(fy1))));
  if (resample && req.window) {
    // Decode the filter's reach around the box too (Pillow's bilinear support is max(1, scale)
    // source pixels on each side of a tap centre); the taps then stop where Pillow's stop: at the
    // image's edges, not the box's.
    const int mx = Resampler::window_margin(fx1 - fx0, req.out_width);
    const int my = Resampler::window_margin(fy1 - fy0, req.out_height);
    plan.x0 = std::max(0, plan.x0 - mx);
    plan.y0 = std::max(0, plan.y0 - my);
    plan.x1 = static_cast<int>(std::min<int64_t>(fw, plan.x1 + mx));
    plan.y1 = static_cast<int>(std::min<int64_t>(fh, plan.y1 + my));
  }
  // The pass order Pillow picks for the image its reference call resizes: the crop (the decoded
  // region), or with `window` the whole frame, resized to the size that maps the box to the output.
  if (resample && req.window)
    plan.horizontal_first =
        Resampler::window_horizontal_first(fh, fw, fy1 - fy0, fx1 - fx0, req.out_height, req.out_width);
  else
    plan.horizontal_first = Resampler::pillow_horizontal_first(plan.y1 - plan.y0, plan.x1 - plan.x0, req.out_height,
                                                               req.out_width);
  plan.bx0 = fx0 - plan.x0;
  plan.by0 = fy0 - plan.y0;
  plan.bx1 = fx1 - plan.x0;
  plan.by1 = fy1 - plan.y0;
  plan.direct = !resample || (plan.scale_num == 8 && Resampler::is_copy(plan.y1 - plan.y0, plan.x1 - plan.x0, plan.bx0,
                                                                         plan.by0, plan.bx1, plan.by1, req.out_height,
                                                                         req.out_width));
  return plan;
}

}  // namespace

// A decompressor keeps the quantization and Huffman tables of the last file it read (libjpeg's
// "abbreviated datastream" feature), and a file that omits a table would be decoded with the last
// file's: its pixels would depend on what this thread decoded before. Every file therefore gets a
// fresh decompressor (create + destroy cost ~0.3 us).
namespace {
void renew(Decoder::State* s) {
  if (s->created) jpeg_destroy_decompress(&s->cinfo);
  s->created = false;
  if (!guarded_create(s)) throw InternalError(std::string("cannot create a JPEG decompressor: ") + s->err.message);
  s->created = true;
  watch_scans(&s->cinfo, &s->err);
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// Decoder

Decoder::Decoder() : state_(new State()) {
  State* s = state_.get();
  std::memset(&s->cinfo, 0, sizeof(s->cinfo));
  install_error_mgr(reinterpret_cast<j_common_ptr>(&s->cinfo), &s->err);
  renew(s);
}

Decoder::~Decoder() {
  if (state_->created) jpeg_destroy_decompress(&state_->cinfo);
}

JpegInfo Decoder::read_header(const uint8_t* data, size_t size) {
  State* s = state_.get();
  renew(s);
  AbortOnExit abort_on_exit{&s->cinfo};
  reset_error_mgr(&s->err, false, g_max_scans.load(std::memory_order_relaxed));
  if (!guarded_read_header(s, data, size)) throw_recorded(s->err);
  const jpeg_decompress_struct& c = s->cinfo;
  JpegInfo info;
  info.height = static_cast<int>(c.image_height);
  info.width = static_cast<int>(c.image_width);
  info.channels = c.num_components;
  info.colorspace = colorspace_of(c.jpeg_color_space);
  info.subsampling = subsampling_of(c);
  info.progressive = c.progressive_mode != 0;
  info.arithmetic = c.arith_code != 0;
  info.restart_interval = static_cast<int>(c.restart_interval);
  info.precision = c.data_precision;
  // As Pillow's exif_transpose finds it: the first APP1 that is EXIF; where it has no Orientation
  // tag (or there is none), tiff:Orientation in the last XMP APP1 (Image.getexif's fallback).
  int exif = 0, xmp = -1;
  for_each_header_segment(data, size, [&](const Segment& seg) {
    if (seg.marker != JPEG_APP0 + 1) return true;
    if (exif == 0) exif = exif_orientation(seg.payload, seg.size);
    const int x = xmp_orientation(seg.payload, seg.size);
    if (x != kNotXmp) xmp = x;  // (the last XMP packet: Pillow keeps the last)
    return true;
  });
  const int o = exif > 0 ? exif : xmp;
  info.orientation = o >= 1 && o <= 8 ? o : 1;
  return info;
}

namespace {

// The restart-marker route: when the file has intact restart markers aligned with MCU rows, cut
// the crop's intervals (plus a margin of two chroma samples, so fancy upsampling sees the same
// neighbours) into a small JPEG, read its header instead, and shift the plan into its frame.
// Returns false (the normal route follows, nothing changed) when the file does not allow it.
bool enter_restart_route(Decoder::State* s, const uint8_t* data, size_t size, Plan* plan) {
  j_decompress_ptr cinfo = &s->cinfo;
  if (cinfo->restart_interval == 0 || cinfo->progressive_mode || cinfo->arith_code ||
      cinfo->comps_in_scan != cinfo->num_components)
    return false;
  const bool single = cinfo->num_components == 1;
  const int mcu_w = single ? 8 : 8 * cinfo->max_h_samp_factor;
  const int mcu_h = single ? 8 : 8 * cinfo->max_v_samp_factor;
  const int W = static_cast<int>(cinfo->image_width), H = static_cast<int>(cinfo->image_height);
  if (!index_restarts(data, size, W, H, cinfo->num_components, mcu_w, mcu_h,
                      static_cast<int>(cinfo->restart_interval), &s->restarts))
    return false;
  const RestartLayout& L = s->restarts;
  const int m = plan->scale_num;
  const int64_t mx = (2 * cinfo->max_h_samp_factor * 8 + m - 1) / m;  // margin, full-res px
  const int64_t my = (2 * cinfo->max_v_samp_factor * 8 + m - 1) / m;
  const int64_t fx0 = std::max<int64_t>(0, plan->x0 * 8 / m - mx);
  const int64_t fx1 = std::min<int64_t>(W - 1, ceil_div(static_cast<int64_t>(plan->x1) * 8, m) - 1 + mx);
  const int64_t fy0 = std::max<int64_t>(0, plan->y0 * 8 / m - my);
  const int64_t fy1 = std::min<int64_t>(H - 1, ceil_div(static_cast<int64_t>(plan->y1) * 8, m) - 1 + my);
  const int group_px = L.interval * L.mcu_width;
  const int row0 = static_cast<int>(fy0 / L.mcu_height), row1 = static_cast<int>(fy1 / L.mcu_height);
  const int g0 = static_cast<int>(fx0 / group_px), g1 = static_cast<int>(fx1 / group_px);
  if (!build_sub_jpeg(data, size, L, row0, row1, g0, g1, &s->sub)) return false;
  jpeg_abort_decompress(cinfo);
  if (!guarded_read_header(s, s->sub.data(), s->sub.size())) throw_recorded(s->err);
  const int shift_x = static_cast<int>(static_cast<int64_t>(g0) * group_px * m / 8);
  const int shift_y = static_cast<int>(static_cast<int64_t>(row0) * L.mcu_height * m / 8);
  plan->x0 -= shift_x;
  plan->x1 -= shift_x;
  plan->y0 -= shift_y;
  plan->y1 -= shift_y;
  return true;
}

}  // namespace

DecodeResult Decoder::decode(const uint8_t* data, size_t size, const DecodeRequest& req, uint8_t* out,
                             size_t out_stride) {
  State* s = state_.get();
  renew(s);
  j_decompress_ptr cinfo = &s->cinfo;
  AbortOnExit abort_on_exit{cinfo};
  reset_error_mgr(&s->err, req.strict, g_max_scans.load(std::memory_order_relaxed));
  if (!guarded_read_header(s, data, size)) throw_recorded(s->err);
  Plan plan = plan_decode(*cinfo, req);
  const int rw = plan.x1 - plan.x0, rh = plan.y1 - plan.y0;
  const bool restart_path = req.use_restarts && enter_restart_route(s, data, size, &plan);
  plan.entropy = restart_path ? nullptr : req.entropy;

  if (plan.direct) {
    plan.dst = out;
    plan.dst_stride = out_stride;
  } else if (plan.convert == Convert::kCopy) {
    plan.rows_in_region = true;  // guarded_decode_rows sizes the region to libjpeg's rows
  } else {
    s->region.resize(static_cast<size_t>(rw) * rh * plan.channels);
    plan.dst = s->region.data();
    plan.dst_stride = plan.region_stride = static_cast<size_t>(rw) * plan.channels;
  }
  const bool decoded = guarded_decode_rows(s, &plan);
  s->huffman.flush_stats();
  if (!decoded) throw_recorded(s->err);
  if (!plan.direct)
    s->resampler.resize(s->region.data() + plan.region_offset, rh, rw, plan.channels, plan.region_stride, plan.bx0,
                        plan.by0, plan.bx1, plan.by1, out, req.out_height, req.out_width, out_stride,
                        plan.horizontal_first);
  DecodeResult result;
  result.scale_num = plan.scale_num;
  result.restart_path = restart_path;
  if (s->err.pub.num_warnings > 0) result.warning = s->err.warning;
  return result;
}

Decoder& thread_decoder() {
  thread_local Decoder decoder;
  return decoder;
}

int libjpeg_turbo_version() { return LIBJPEG_TURBO_VERSION_NUMBER; }

int jpeg_lib_version() { return JPEG_LIB_VERSION; }

std::vector<std::string> libjpeg_message_formats() {
  jpeg_error_mgr std_err;
  jpeg_std_error(&std_err);
  std::vector<std::string> formats;
  for (int i = 1; i <= std_err.last_jpeg_message; ++i)
    if (std_err.jpeg_message_table[i]) formats.emplace_back(std_err.jpeg_message_table[i]);
  return formats;
}

}  // namespace gpupipe
