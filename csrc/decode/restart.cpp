#include "decode/restart.h"

#include <algorithm>
#include <climits>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <jpeglib.h>
#include <jerror.h>

#include "common/errors.h"
#include "decode/jpeg_decoder.h"
#include "decode/jpeg_error.h"
#include "decode/jpeg_segments.h"

namespace gpupipe {

namespace {
uint32_t be16(const uint8_t* p) { return static_cast<uint32_t>(p[0]) << 8 | p[1]; }
}  // namespace

bool index_restarts(const uint8_t* d, size_t n, int width, int height, int components, int mcu_width,
                    int mcu_height, int restart_interval, RestartLayout* L) {
  if (restart_interval <= 0 || mcu_width <= 0 || mcu_height <= 0 || width <= 0 || height <= 0) return false;
  if (n < 4 || d[0] != 0xFF || d[1] != 0xD8) return false;
  L->width = width;
  L->height = height;
  L->mcu_width = mcu_width;
  L->mcu_height = mcu_height;
  L->mcus_per_row = (width + mcu_width - 1) / mcu_width;
  L->mcu_rows = (height + mcu_height - 1) / mcu_height;
  if (L->mcus_per_row % restart_interval != 0) return false;
  L->interval = restart_interval;
  L->groups_per_row = L->mcus_per_row / restart_interval;

  // Walk the marker segments to the one SOF (baseline/extended Huffman only) and the first SOS,
  // as libjpeg reads them: a marker right after each segment, fill bytes allowed, standalone
  // markers without a length. Anything else (garbage between segments, which libjpeg skips with
  // a warning) is not ours to cut: the normal path decodes it.
  size_t i = 2;
  bool sof = false;
  while (true) {
    if (n - i < 2 || d[i] != 0xFF) return false;
    const uint8_t m = d[i + 1];
    if (m == 0xFF) {  // fill byte
      ++i;
      continue;
    }
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) {  // TEM, RSTn: no length
      i += 2;
      continue;
    }
    if (m == 0x00 || m == 0xD8 || m == 0xD9) return false;
    if (n - i < 4) return false;
    const size_t len = be16(d + i + 2);
    if (len < 2 || len > n - i - 2) return false;
    if (m == 0xC0 || m == 0xC1) {
      if (sof || len < 8) return false;
      const int nf = d[i + 9];
      if (len != 8 + 3 * static_cast<size_t>(nf) || nf != components || d[i + 4] != 8) return false;
      if (static_cast<int>(be16(d + i + 5)) != height || static_cast<int>(be16(d + i + 7)) != width) return false;
      L->sof_offset = i;
      sof = true;
    } else if (m >= 0xC2 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) {
      return false;  // progressive, lossless or arithmetic: not indexable
    } else if (m == 0xDA) {
      if (!sof || len < 3) return false;
      const int ns = d[i + 4];
      if (ns != components || len < 6 + 2 * static_cast<size_t>(ns)) return false;
      L->scan_offset = i + 2 + len;
      break;
    }
    i += 2 + len;
  }

  // Find the RST markers; every interval but the last ends at one, numbered 0..7 cyclically.
  const size_t total = static_cast<size_t>(L->mcu_rows) * L->groups_per_row;
  L->starts.assign(1, L->scan_offset);
  L->ends.clear();
  // The header's claim is not trusted for the reservation: a real interval takes >= 2 bytes.
  L->starts.reserve(std::min(total, n / 2 + 2));
  L->ends.reserve(std::min(total, n / 2 + 2));
  size_t p = L->scan_offset;
  while (p < n) {
    const void* hit = std::memchr(d + p, 0xFF, n - p);
    if (!hit) return false;  // no EOI
    p = static_cast<const uint8_t*>(hit) - d;
    if (n - p < 2) return false;
    const uint8_t m = d[p + 1];
    if (m == 0x00 || m == 0xFF) {  // stuffing or fill
      p += 1 + (m == 0x00);
      continue;
    }
    if (m >= 0xD0 && m <= 0xD7) {
      if (m - 0xD0 != static_cast<int>(L->ends.size() % 8)) return false;  // damaged numbering
      L->ends.push_back(p);
      L->starts.push_back(p + 2);
      p += 2;
      if (L->ends.size() >= total) return false;  // more markers than intervals
      continue;
    }
    if (m == 0xD9) {  // EOI
      L->ends.push_back(p);
      return L->ends.size() == total;
    }
    return false;  // another marker inside the scan (DNL, a second scan, ...)
  }
  return false;
}

bool build_sub_jpeg(const uint8_t* d, size_t n, const RestartLayout& L, int row0, int row1, int group0, int group1,
                    std::vector<uint8_t>* out) {
  if (row0 < 0 || row0 > row1 || row1 >= L.mcu_rows || group0 < 0 || group0 > group1 || group1 >= L.groups_per_row)
    return false;
  const size_t total = static_cast<size_t>(L.mcu_rows) * L.groups_per_row;
  if (L.scan_offset > n || L.sof_offset + 9 > L.scan_offset || L.starts.size() != total || L.ends.size() != total)
    return false;
  const int w = std::min(L.width - group0 * L.interval * L.mcu_width,
                         (group1 - group0 + 1) * L.interval * L.mcu_width);
  const int h = std::min(L.height - row0 * L.mcu_height, (row1 - row0 + 1) * L.mcu_height);
  if (w < 1 || h < 1 || w > 0xFFFF || h > 0xFFFF) return false;
  out->clear();
  out->insert(out->end(), d, d + L.scan_offset);
  uint8_t* sof = out->data() + L.sof_offset;
  sof[5] = static_cast<uint8_t>(h >> 8);
  sof[6] = static_cast<uint8_t>(h & 0xFF);
  sof[7] = static_cast<uint8_t>(w >> 8);
  sof[8] = static_cast<uint8_t>(w & 0xFF);
  int k = 0;
  for (int r = row0; r <= row1; ++r) {
    for (int g = group0; g <= group1; ++g) {
      if (k > 0) {
        out->push_back(0xFF);
        out->push_back(static_cast<uint8_t>(0xD0 + (k - 1) % 8));
      }
      const size_t idx = static_cast<size_t>(r) * L.groups_per_row + g;
      if (L.starts[idx] > L.ends[idx] || L.ends[idx] > n) return false;
      out->insert(out->end(), d + L.starts[idx], d + L.ends[idx]);
      ++k;
    }
  }
  out->push_back(0xFF);
  out->push_back(0xD9);
  return true;
}

// ---------------------------------------------------------------------------------------------
// Lossless transcode

namespace {

// The transcode's output: a buffer of ours that grows by doubling. Not jpeg_mem_dest: libjpeg-turbo
// frees its first buffer when it grows and reports the new one only at the end, so an error in
// between left the caller's pointer on freed memory (a double free, found by fuzz_transcode) and
// the new buffer leaked.
struct GrowingDestination {
  jpeg_destination_mgr pub{};  // first: libjpeg's callbacks get &pub
  unsigned char* data = nullptr;
  size_t capacity = 0;

  size_t size() const { return data ? capacity - pub.free_in_buffer : 0; }

  static bool grow(GrowingDestination* d, size_t used) {
    const size_t capacity = d->capacity ? 2 * d->capacity : 4096;
    auto* bigger = static_cast<unsigned char*>(std::realloc(d->data, capacity));
    if (!bigger) return false;
    d->data = bigger;
    d->capacity = capacity;
    d->pub.next_output_byte = bigger + used;
    d->pub.free_in_buffer = capacity - used;
    return true;
  }
  static void init(j_compress_ptr cinfo) {
    auto* d = reinterpret_cast<GrowingDestination*>(cinfo->dest);
    if (!grow(d, 0)) ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 10);
  }
  static boolean empty(j_compress_ptr cinfo) {  // the whole buffer is full
    auto* d = reinterpret_cast<GrowingDestination*>(cinfo->dest);
    if (!grow(d, d->capacity)) ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 10);
    return TRUE;
  }
  static void term(j_compress_ptr) {}
};

// The libjpeg objects of one transcode, destroyed whatever happens (outside any setjmp frame).
struct Transcoder {
  jpeg_decompress_struct src;
  jpeg_compress_struct dst;
  JpegErrorMgr err;  // one manager for both objects: an error in either lands in the same frame
  bool created = false;
  GrowingDestination out;
  std::vector<Segment> markers;  // the source's APPn and COM segments, copied to the output

  Transcoder() {
    std::memset(&src, 0, sizeof(src));
    std::memset(&dst, 0, sizeof(dst));
    install_error_mgr(reinterpret_cast<j_common_ptr>(&src), &err);
    dst.err = src.err;
    out.pub.init_destination = &GrowingDestination::init;
    out.pub.empty_output_buffer = &GrowingDestination::empty;
    out.pub.term_destination = &GrowingDestination::term;
  }
  ~Transcoder() {
    if (created) {
      jpeg_destroy_compress(&dst);
      jpeg_destroy_decompress(&src);
    }
    std::free(out.data);
  }
};

// A progressive file whose scans determined every coefficient to its last bit. Where they did not,
// libjpeg's decoder smooths the missing AC coefficients from the neighbouring blocks (block
// smoothing), so the file's pixels are not a function of its coefficients alone.
bool complete_progression(const jpeg_decompress_struct* src) {
  if (!src->coef_bits) return false;
  for (int c = 0; c < src->num_components; ++c)
    for (int k = 0; k < DCTSIZE2; ++k)
      if (src->coef_bits[c][k] != 0) return false;
  return true;
}

// setjmp frames: they own no destructible objects.
bool guarded_open(Transcoder* t, const uint8_t* data, size_t size) {
  if (setjmp(t->err.jump)) return false;
  jpeg_create_decompress(&t->src);
  jpeg_create_compress(&t->dst);
  t->created = true;
  watch_scans(&t->src, &t->err);
  jpeg_mem_src(&t->src, data, static_cast<unsigned long>(size));
  jpeg_read_header(&t->src, TRUE);  // APPn and COM are copied from the bytes (jpeg_segments.h)
  return true;
}

bool guarded_transcode(Transcoder* t, int restart_rows, int restart_mcus, uint64_t max_memory) {
  jpeg_decompress_struct* src = &t->src;
  jpeg_compress_struct* dst = &t->dst;
  if (setjmp(t->err.jump)) return false;
  const long memory = static_cast<long>(std::min<uint64_t>(max_memory, LONG_MAX));
  src->mem->max_memory_to_use = memory;  // whole-image coefficient arrays beyond it: refused
  dst->mem->max_memory_to_use = memory;
  jvirt_barray_ptr* coefficients = jpeg_read_coefficients(src);
  if (src->progressive_mode && !complete_progression(src)) {
    record_error(&t->err, ErrorKind::kUnsupported,
                 "progressive scans leave coefficients unknown, which libjpeg's decoder smooths over: a "
                 "baseline copy would not decode to the same pixels");
    return false;
  }
  jpeg_copy_critical_parameters(src, dst);
  dst->optimize_coding = TRUE;
  dst->arith_code = FALSE;
  // Intervals of ~restart_mcus MCUs that tile each MCU row exactly (so crops can skip columns);
  // when the row length has no divisor in [target/2, target], whole rows.
  int interval = 0;
  if (restart_mcus > 0) {
    const int mcu_w = src->num_components == 1 ? 8 : 8 * src->max_h_samp_factor;
    const int per_row = static_cast<int>((src->image_width + mcu_w - 1) / mcu_w);
    for (int d = restart_mcus; d >= std::max(2, (restart_mcus + 1) / 2); --d)
      if (per_row % d == 0) {
        interval = d;
        break;
      }
  }
  if (interval > 0)
    dst->restart_interval = static_cast<unsigned int>(interval);
  else
    dst->restart_in_rows = restart_rows;
  dst->dest = &t->out.pub;
  // jpeg_write_coefficients writes JFIF/Adobe headers itself when the color space calls for them.
  dst->write_JFIF_header = src->saw_JFIF_marker ? TRUE : FALSE;
  jpeg_write_coefficients(dst, coefficients);
  for (const Segment& m : t->markers) {
    if (dst->write_JFIF_header && m.marker == JPEG_APP0 && m.size >= 5 && std::memcmp(m.payload, "JFIF", 5) == 0)
      continue;  // already written
    if (dst->write_Adobe_marker && m.marker == JPEG_APP0 + 14 && m.size >= 5 && std::memcmp(m.payload, "Adobe", 5) == 0)
      continue;
    jpeg_write_marker(dst, m.marker, m.payload, static_cast<unsigned int>(m.size));
  }
  jpeg_finish_compress(dst);
  jpeg_finish_decompress(src);  // reads to EOI: trailing corruption warns (and fails: strict)
  return true;
}

[[noreturn]] void throw_transcode_error(const JpegErrorMgr& err) {
  if (err.kind == ErrorKind::kCorrupt && err.pub.num_warnings > 0)
    throw DecodeError(ErrorKind::kCorrupt, std::string("the source has corrupt or truncated data (") + err.warning +
                                               "): not transcoded");
  throw_recorded(err);
}

}  // namespace

std::vector<uint8_t> transcode_with_restarts(const uint8_t* data, size_t size, int restart_rows, int restart_mcus) {
  if (restart_rows < 1 && restart_mcus < 1) throw InvalidArgument("restart_rows or restart_mcus must be >= 1");
  if (restart_rows > 0xFFFF || restart_mcus > 0xFFFF) throw InvalidArgument("restart_rows and restart_mcus must be <= 65535");
  const Limits limits = get_limits();
  Transcoder t;
  reset_error_mgr(&t.err, /*strict=*/true, limits.max_scans);  // any warning: a corrupt source
  if (!guarded_open(&t, data, size)) throw_transcode_error(t.err);
  for_each_header_segment(data, size, [&](const Segment& seg) {
    if ((seg.marker >= JPEG_APP0 && seg.marker <= JPEG_APP0 + 15) || seg.marker == JPEG_COM) t.markers.push_back(seg);
    return true;
  });
  check_pixel_limit(t.src.image_height, t.src.image_width);  // before the coefficient arrays exist
  if (t.src.data_precision != 8)
    throw DecodeError(ErrorKind::kUnsupported, "only 8-bit JPEGs can be transcoded");
  if (!guarded_transcode(&t, restart_rows, restart_mcus, limits.max_memory)) throw_transcode_error(t.err);
  return std::vector<uint8_t>(t.out.data, t.out.data + t.out.size());
}

}  // namespace gpupipe
