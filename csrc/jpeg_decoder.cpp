#include "jpeg_decoder.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <vector>

#include <jpeglib.h>

#include "errors.h"
#include "resize.h"
#include "restart.h"

namespace gpupipe {

// ---------------------------------------------------------------------------------------------
// Limits

namespace {
std::atomic<uint64_t> g_max_pixels{Limits{}.max_pixels};
std::atomic<int> g_max_scans{Limits{}.max_scans};
std::atomic<uint64_t> g_max_memory{Limits{}.max_memory};
}  // namespace

Limits get_limits() {
  Limits l;
  l.max_pixels = g_max_pixels.load();
  l.max_scans = g_max_scans.load();
  l.max_memory = g_max_memory.load();
  return l;
}

void set_limits(const Limits& l) {
  if (l.max_pixels == 0 || l.max_scans <= 0 || l.max_memory == 0)
    throw InvalidArgument("limits must be positive");
  g_max_pixels = l.max_pixels;
  g_max_scans = l.max_scans;
  g_max_memory = l.max_memory;
}

int choose_scale_num(int64_t box_h, int64_t box_w, int out_h, int out_w) {
  if (box_h < 2 * static_cast<int64_t>(out_h) || box_w < 2 * static_cast<int64_t>(out_w)) return 8;
  for (int m = 1; m <= 4; ++m)
    if (box_h * m >= 8LL * out_h && box_w * m >= 8LL * out_w) return m;
  return 8;  // unreachable: m = 4 always covers a 2x box
}

// ---------------------------------------------------------------------------------------------
// libjpeg glue. Errors longjmp back into the guarded_* functions below, each of which owns no
// destructible object, so no C++ destructor is ever skipped.

namespace {

struct ErrorMgr {
  jpeg_error_mgr pub;
  jmp_buf jump;
  jpeg_progress_mgr progress;
  char message[JMSG_LENGTH_MAX + 96];
  char warning[JMSG_LENGTH_MAX];
  bool strict;
  int max_scans;
};

ErrorMgr* error_mgr(j_common_ptr cinfo) { return reinterpret_cast<ErrorMgr*>(cinfo->err); }

void on_error_exit(j_common_ptr cinfo) {
  ErrorMgr* e = error_mgr(cinfo);
  (*cinfo->err->format_message)(cinfo, e->message);
  longjmp(e->jump, 1);
}

void on_emit_message(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace output
  ErrorMgr* e = error_mgr(cinfo);
  if (e->pub.num_warnings++ == 0) (*cinfo->err->format_message)(cinfo, e->warning);
  if (e->strict) {
    char text[JMSG_LENGTH_MAX];
    (*cinfo->err->format_message)(cinfo, text);
    std::snprintf(e->message, sizeof(e->message), "%s (strict=True turns this warning into an error)",
                  text);
    longjmp(e->jump, 1);
  }
}

// Called by libjpeg between scans: refuses progressive "scan bombs" (thousands of tiny scans that
// each cost a pass over the whole coefficient buffer), like libjpeg-turbo's own fuzz targets.
void on_progress(j_common_ptr cinfo) {
  if (!cinfo->is_decompressor) return;
  ErrorMgr* e = error_mgr(cinfo);
  const int scans = reinterpret_cast<j_decompress_ptr>(cinfo)->input_scan_number;
  if (scans > e->max_scans) {
    std::snprintf(e->message, sizeof(e->message),
                  "progressive JPEG has more than max_scans=%d scans: refused as a possible scan "
                  "bomb (gpupipe.set_limits(max_scans=...) raises the limit)",
                  e->max_scans);
    longjmp(e->jump, 1);
  }
}

// How decoded rows become output rows.
enum class Convert : int { kCopy, kCmykToRgb, kCmykToGray };

struct RowPlan {
  int scale_num;
  J_COLOR_SPACE out_space;
  Convert convert;
  int x0, x1, y0, y1;  // window in the (scaled) output frame
  uint8_t* dst;
  size_t dst_stride;
  uint64_t max_memory;
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
  ErrorMgr err;
  Resampler resampler;
  std::vector<uint8_t> region;  // the decoded window, before resizing
  RestartLayout restarts;       // restart-marker index of the current file
  std::vector<uint8_t> sub;     // the synthetic JPEG of the crop's restart intervals
};

namespace {

void reset_errors(Decoder::State* s, bool strict) {
  s->err.pub.num_warnings = 0;
  s->err.message[0] = '\0';
  s->err.warning[0] = '\0';
  s->err.strict = strict;
  s->err.max_scans = g_max_scans.load(std::memory_order_relaxed);
}

bool guarded_read_header(Decoder::State* s, const uint8_t* data, size_t size, bool save_exif) {
  if (setjmp(s->err.jump)) return false;
  jpeg_save_markers(&s->cinfo, JPEG_APP0 + 1, save_exif ? 0xFFFF : 0);
  jpeg_mem_src(&s->cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&s->cinfo, TRUE);
  return true;
}

// Decodes rows [y0, y1) x columns [x0, x1) of the scaled output frame into plan->dst.
bool guarded_decode_rows(Decoder::State* s, const RowPlan* plan) {
  j_decompress_ptr cinfo = &s->cinfo;
  if (setjmp(s->err.jump)) return false;
  cinfo->scale_num = static_cast<unsigned int>(plan->scale_num);
  cinfo->scale_denom = 8;
  cinfo->out_color_space = plan->out_space;
  cinfo->dct_method = JDCT_ISLOW;
  cinfo->do_fancy_upsampling = TRUE;
  cinfo->mem->max_memory_to_use = static_cast<long>(plan->max_memory);
  jpeg_start_decompress(cinfo);

  // Fancy (triangle) chroma upsampling replicates the window's outermost chroma samples, so the
  // window's edge columns differ from a full decode. Widen the window by two chroma samples on
  // each side (jpeg_crop_scanline then aligns the left edge down to an iMCU) and trim.
  const int margin = 2 * cinfo->max_h_samp_factor;
  const JDIMENSION full_w = cinfo->output_width;
  JDIMENSION xoff = plan->x0 > margin ? static_cast<JDIMENSION>(plan->x0 - margin) : 0;
  JDIMENSION xend = std::min<JDIMENSION>(full_w, static_cast<JDIMENSION>(plan->x1 + margin));
  JDIMENSION cw = xend - xoff;
  if (xoff > 0 || cw < full_w) jpeg_crop_scanline(cinfo, &xoff, &cw);
  if (plan->y0 > 0) {
    JDIMENSION skipped = jpeg_skip_scanlines(cinfo, static_cast<JDIMENSION>(plan->y0));
    if (skipped != static_cast<JDIMENSION>(plan->y0)) {
      std::snprintf(s->err.message, sizeof(s->err.message), "JPEG data ends before row %d", plan->y0);
      return false;
    }
  }
  const int comps = cinfo->output_components;
  JSAMPARRAY rows = (*cinfo->mem->alloc_sarray)(reinterpret_cast<j_common_ptr>(cinfo), JPOOL_IMAGE,
                                                cw * static_cast<JDIMENSION>(comps), kRowsPerRead);
  const int col = plan->x0 - static_cast<int>(xoff);
  const int width = plan->x1 - plan->x0;
  int y = plan->y0;
  while (y < plan->y1) {
    JDIMENSION want = static_cast<JDIMENSION>(std::min(kRowsPerRead, plan->y1 - y));
    JDIMENSION got = jpeg_read_scanlines(cinfo, rows, want);
    if (got == 0) {
      std::snprintf(s->err.message, sizeof(s->err.message), "JPEG decoder produced no row %d", y);
      return false;
    }
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

uint32_t read_u16(const uint8_t* p, bool le) { return le ? p[0] | p[1] << 8 : p[0] << 8 | p[1]; }
uint32_t read_u32(const uint8_t* p, bool le) {
  return le ? p[0] | p[1] << 8 | p[2] << 16 | static_cast<uint32_t>(p[3]) << 24
            : static_cast<uint32_t>(p[0]) << 24 | p[1] << 16 | p[2] << 8 | p[3];
}

// The Orientation tag (0x0112) of IFD0 in an APP1 "Exif" payload; 1 when absent or malformed.
int exif_orientation(const uint8_t* p, size_t n) {
  if (n < 14 || std::memcmp(p, "Exif\0\0", 6) != 0) return 1;
  const uint8_t* t = p + 6;
  const size_t tn = n - 6;
  bool le;
  if (t[0] == 'I' && t[1] == 'I') le = true;
  else if (t[0] == 'M' && t[1] == 'M') le = false;
  else return 1;
  if (read_u16(t + 2, le) != 42) return 1;
  const uint64_t ifd = read_u32(t + 4, le);
  if (ifd + 2 > tn) return 1;
  const uint32_t count = read_u16(t + ifd, le);
  for (uint32_t i = 0; i < count; ++i) {
    const uint64_t e = ifd + 2 + 12ull * i;
    if (e + 12 > tn) break;
    if (read_u16(t + e, le) == 0x0112) {
      if (read_u16(t + e + 2, le) != 3) return 1;  // must be SHORT
      const uint32_t v = read_u16(t + e + 8, le);
      return v >= 1 && v <= 8 ? static_cast<int>(v) : 1;
    }
  }
  return 1;
}

const char* colorspace_name(J_COLOR_SPACE cs) {
  switch (cs) {
    case JCS_GRAYSCALE: return "gray";
    case JCS_YCbCr: return "ycbcr";
    case JCS_RGB: return "rgb";
    case JCS_CMYK: return "cmyk";
    case JCS_YCCK: return "ycck";
    default: return "unknown";
  }
}

std::string subsampling_name(const jpeg_decompress_struct& c) {
  if (c.num_components == 1) return "gray";
  const int h0 = c.comp_info[0].h_samp_factor, v0 = c.comp_info[0].v_samp_factor;
  const int h1 = c.comp_info[1].h_samp_factor, v1 = c.comp_info[1].v_samp_factor;
  for (int i = 2; i < c.num_components; ++i)
    if (c.comp_info[i].h_samp_factor != h1 || c.comp_info[i].v_samp_factor != v1) return "other";
  if (h0 % h1 || v0 % v1) return "other";
  const int h = h0 / h1, v = v0 / v1;
  if (h == 1 && v == 1) return "4:4:4";
  if (h == 2 && v == 1) return "4:2:2";
  if (h == 2 && v == 2) return "4:2:0";
  if (h == 1 && v == 2) return "4:4:0";
  if (h == 4 && v == 1) return "4:1:1";
  if (h == 4 && v == 2) return "4:1:0";
  return "other";
}

void check_pixel_limit(uint64_t height, uint64_t width) {
  const uint64_t limit = g_max_pixels.load(std::memory_order_relaxed);
  if (height * width > limit)
    throw TooLarge("image is " + std::to_string(width) + "x" + std::to_string(height) + " = " +
                   std::to_string(height * width) + " pixels, over the max_pixels limit of " +
                   std::to_string(limit) +
                   " (a possible decompression bomb; gpupipe.set_limits(max_pixels=...) raises it)");
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// libjpeg's message, plus what the user can do about the cases this build cannot decode.
[[noreturn]] void throw_decode_error(const char* message) {
  std::string m = message;
  if (m.find("data precision 12") != std::string::npos)
    m += " (12-bit JPEG: this libjpeg-turbo build decodes 8-bit JPEGs only; convert the file, e.g. "
         "with Pillow or ImageMagick)";
  else if (m.find("SOF type 0xc3") != std::string::npos || m.find("SOF type 0xc7") != std::string::npos ||
           m.find("SOF type 0xcb") != std::string::npos || m.find("SOF type 0xcf") != std::string::npos)
    m += " (lossless JPEG is not supported by libjpeg-turbo 2.x)";
  else if (m.find("Backing store not supported") != std::string::npos)
    m += " (the decode needs more working memory than max_memory; gpupipe.set_limits(max_memory=...) "
         "raises the limit)";
  throw DecodeError(m);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Decoder

Decoder::Decoder() : state_(new State()) {
  State* s = state_.get();
  std::memset(&s->cinfo, 0, sizeof(s->cinfo));
  s->cinfo.err = jpeg_std_error(&s->err.pub);
  s->err.pub.error_exit = on_error_exit;
  s->err.pub.emit_message = on_emit_message;
  s->err.progress.progress_monitor = on_progress;
  s->err.strict = false;
  s->err.max_scans = Limits{}.max_scans;
  jpeg_create_decompress(&s->cinfo);  // cannot fail except on out-of-memory before any jmp_buf
  s->cinfo.progress = &s->err.progress;
}

Decoder::~Decoder() { jpeg_destroy_decompress(&state_->cinfo); }

JpegInfo Decoder::read_header(const uint8_t* data, size_t size) {
  State* s = state_.get();
  AbortOnExit abort_on_exit{&s->cinfo};
  reset_errors(s, false);
  if (!guarded_read_header(s, data, size, true)) throw_decode_error(s->err.message);
  const jpeg_decompress_struct& c = s->cinfo;
  JpegInfo info;
  info.height = static_cast<int>(c.image_height);
  info.width = static_cast<int>(c.image_width);
  info.channels = c.num_components;
  info.colorspace = colorspace_name(c.jpeg_color_space);
  info.subsampling = subsampling_name(c);
  info.progressive = c.progressive_mode != 0;
  info.arithmetic = c.arith_code != 0;
  info.restart_interval = static_cast<int>(c.restart_interval);
  info.precision = c.data_precision;
  for (jpeg_saved_marker_ptr m = c.marker_list; m; m = m->next) {
    if (m->marker == JPEG_APP0 + 1) {
      info.orientation = exif_orientation(m->data, m->data_length);
      break;
    }
  }
  return info;
}

DecodeResult Decoder::decode(const uint8_t* data, size_t size, const DecodeRequest& req,
                             uint8_t* out, size_t out_stride) {
  State* s = state_.get();
  j_decompress_ptr cinfo = &s->cinfo;
  AbortOnExit abort_on_exit{cinfo};
  reset_errors(s, req.strict);
  if (!guarded_read_header(s, data, size, false)) throw_decode_error(s->err.message);

  const int64_t H = cinfo->image_height, W = cinfo->image_width;
  check_pixel_limit(static_cast<uint64_t>(H), static_cast<uint64_t>(W));
  int m = 8;
  if (req.force_scale_num) {
    if (req.force_scale_num < 1 || req.force_scale_num > 8)
      throw InvalidArgument("scale must be M/8 with M in 1..8");
    m = req.force_scale_num;
  } else if (req.resize && req.dct_scaling) {
    m = choose_scale_num(req.box.height, req.box.width, req.out_height, req.out_width);
  }
  // libjpeg scales the frame to ceil(W * M / 8) x ceil(H * M / 8).
  const int64_t sw = ceil_div(W * m, 8), sh = ceil_div(H * m, 8);
  const int64_t frame_w = req.scaled_box ? sw : W, frame_h = req.scaled_box ? sh : H;
  const Box& b = req.box;
  if (b.height < 1 || b.width < 1 || b.top < 0 || b.left < 0 || b.top + b.height > frame_h ||
      b.left + b.width > frame_w)
    throw InvalidArgument("crop box (top=" + std::to_string(b.top) + ", left=" +
                          std::to_string(b.left) + ", height=" + std::to_string(b.height) +
                          ", width=" + std::to_string(b.width) + ") is not inside the image of " +
                          std::to_string(frame_w) + "x" + std::to_string(frame_h) +
                          " (width x height)");
  if (req.out_height < 1 || req.out_width < 1) throw InvalidArgument("output size must be >= 1");
  if (!req.resize && !req.scaled_box && m != 8)
    throw InvalidArgument("a DCT-scaled decode needs resize or a box in the scaled frame");
  if ((!req.resize || req.scaled_box) && (req.out_height != b.height || req.out_width != b.width))
    throw InvalidArgument("output size differs from the box size but resize is off");

  RowPlan plan{};
  const J_COLOR_SPACE in_space = cinfo->jpeg_color_space;
  const bool rgb = req.mode == ColorMode::kRGB;
  if (in_space == JCS_CMYK || in_space == JCS_YCCK) {
    plan.out_space = JCS_CMYK;
    plan.convert = rgb ? Convert::kCmykToRgb : Convert::kCmykToGray;
  } else if (in_space == JCS_GRAYSCALE || in_space == JCS_YCbCr || in_space == JCS_RGB) {
    plan.out_space = rgb ? JCS_RGB : JCS_GRAYSCALE;
    plan.convert = Convert::kCopy;
  } else {
    throw DecodeError("unsupported JPEG color space with " + std::to_string(cinfo->num_components) +
                      " components");
  }
  const int channels = channels_of(req.mode);

  plan.scale_num = m;
  plan.max_memory = g_max_memory.load(std::memory_order_relaxed);

  // The box in the scaled frame and the whole pixels that cover it. Scaled pixel j covers
  // full-resolution pixels [8j/M, 8(j+1)/M).
  const double k = req.scaled_box ? 1.0 : m / 8.0;
  const double fx0 = b.left * k, fx1 = (b.left + b.width) * k;
  const double fy0 = b.top * k, fy1 = (b.top + b.height) * k;
  plan.x0 = static_cast<int>(std::floor(fx0));
  plan.y0 = static_cast<int>(std::floor(fy0));
  plan.x1 = static_cast<int>(std::min<int64_t>(sw, static_cast<int64_t>(std::ceil(fx1))));
  plan.y1 = static_cast<int>(std::min<int64_t>(sh, static_cast<int64_t>(std::ceil(fy1))));
  const int rw = plan.x1 - plan.x0, rh = plan.y1 - plan.y0;
  // The box relative to the decoded region (before any shift into a sub-JPEG's frame).
  const double bx0 = fx0 - plan.x0, by0 = fy0 - plan.y0, bx1 = fx1 - plan.x0, by1 = fy1 - plan.y0;

  // Restart-marker fast path: cut the crop's intervals (plus a margin of two chroma samples, so
  // fancy upsampling sees the same neighbours) into a small JPEG and decode that instead.
  bool restart_path = false;
  if (req.use_restarts && cinfo->restart_interval > 0 && !cinfo->progressive_mode && !cinfo->arith_code &&
      cinfo->comps_in_scan == cinfo->num_components) {
    const bool single = cinfo->num_components == 1;
    const int mcu_w = single ? 8 : 8 * cinfo->max_h_samp_factor;
    const int mcu_h = single ? 8 : 8 * cinfo->max_v_samp_factor;
    if (index_restarts(data, size, static_cast<int>(W), static_cast<int>(H), mcu_w, mcu_h,
                       static_cast<int>(cinfo->restart_interval), &s->restarts)) {
      const RestartLayout& L = s->restarts;
      const int64_t mx = (2 * cinfo->max_h_samp_factor * 8 + m - 1) / m;  // margin, full-res px
      const int64_t my = (2 * cinfo->max_v_samp_factor * 8 + m - 1) / m;
      const int64_t fx0 = std::max<int64_t>(0, plan.x0 * 8 / m - mx);
      const int64_t fx1 = std::min<int64_t>(W - 1, ceil_div(static_cast<int64_t>(plan.x1) * 8, m) - 1 + mx);
      const int64_t fy0 = std::max<int64_t>(0, plan.y0 * 8 / m - my);
      const int64_t fy1 = std::min<int64_t>(H - 1, ceil_div(static_cast<int64_t>(plan.y1) * 8, m) - 1 + my);
      const int group_px = L.interval * L.mcu_width;
      const int row0 = static_cast<int>(fy0 / L.mcu_height), row1 = static_cast<int>(fy1 / L.mcu_height);
      const int g0 = static_cast<int>(fx0 / group_px), g1 = static_cast<int>(fx1 / group_px);
      build_sub_jpeg(data, L, row0, row1, g0, g1, &s->sub);
      jpeg_abort_decompress(cinfo);
      if (!guarded_read_header(s, s->sub.data(), s->sub.size(), false)) throw_decode_error(s->err.message);
      const int shift_x = static_cast<int>(static_cast<int64_t>(g0) * group_px * m / 8);
      const int shift_y = static_cast<int>(static_cast<int64_t>(row0) * L.mcu_height * m / 8);
      plan.x0 -= shift_x;
      plan.x1 -= shift_x;
      plan.y0 -= shift_y;
      plan.y1 -= shift_y;
      restart_path = true;
    }
  }

  const bool direct = !req.resize || req.scaled_box ||
                      (m == 8 && rw == req.out_width && rh == req.out_height);
  if (direct) {
    plan.dst = out;
    plan.dst_stride = out_stride;
  } else {
    s->region.resize(static_cast<size_t>(rw) * rh * channels);
    plan.dst = s->region.data();
    plan.dst_stride = static_cast<size_t>(rw) * channels;
  }
  if (!guarded_decode_rows(s, &plan)) throw_decode_error(s->err.message);

  if (!direct)
    s->resampler.resize(s->region.data(), rh, rw, channels, plan.dst_stride, bx0, by0, bx1, by1, out,
                        req.out_height, req.out_width, out_stride);
  DecodeResult result;
  result.scale_num = m;
  result.restart_path = restart_path;
  if (s->err.pub.num_warnings > 0) result.warning = s->err.warning;
  return result;
}

Decoder& thread_decoder() {
  thread_local Decoder decoder;
  return decoder;
}

}  // namespace gpupipe
