#include "restart.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <jpeglib.h>

#include "errors.h"
#include "jpeg_error.h"

namespace gpupipe {

bool index_restarts(const uint8_t* d, size_t n, int width, int height, int mcu_width, int mcu_height,
                    int restart_interval, RestartLayout* L) {
  if (restart_interval <= 0 || mcu_width <= 0 || mcu_height <= 0) return false;
  L->width = width;
  L->height = height;
  L->mcu_width = mcu_width;
  L->mcu_height = mcu_height;
  L->mcus_per_row = (width + mcu_width - 1) / mcu_width;
  L->mcu_rows = (height + mcu_height - 1) / mcu_height;
  if (L->mcus_per_row % restart_interval != 0) return false;
  L->interval = restart_interval;
  L->groups_per_row = L->mcus_per_row / restart_interval;

  // Walk the marker segments to SOF (baseline/extended Huffman only) and the single SOS.
  size_t i = 2;
  bool sof = false;
  while (true) {
    if (i + 4 > n || d[i] != 0xFF) return false;
    const uint8_t m = d[i + 1];
    if (m == 0xFF) { ++i; continue; }  // fill byte
    const size_t len = (static_cast<size_t>(d[i + 2]) << 8) | d[i + 3];
    if (len < 2 || i + 2 + len > n) return false;
    if (m == 0xC0 || m == 0xC1) {
      L->sof_offset = i;
      sof = true;
    } else if ((m >= 0xC2 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC)) {
      return false;  // progressive, lossless or arithmetic: not indexable
    } else if (m == 0xDA) {
      if (!sof) return false;
      L->scan_offset = i + 2 + len;
      break;
    }
    i += 2 + len;
  }

  // Find the RST markers; every interval but the last ends at one, numbered 0..7 cyclically.
  const size_t total = static_cast<size_t>(L->mcu_rows) * L->groups_per_row;
  L->starts.assign(1, L->scan_offset);
  L->ends.clear();
  L->starts.reserve(total);
  L->ends.reserve(total);
  size_t p = L->scan_offset;
  while (true) {
    const void* hit = std::memchr(d + p, 0xFF, n - p);
    if (!hit) return false;  // no EOI
    p = static_cast<const uint8_t*>(hit) - d;
    if (p + 1 >= n) return false;
    const uint8_t m = d[p + 1];
    if (m == 0x00 || m == 0xFF) { p += 1 + (m == 0x00); continue; }  // stuffing or fill
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
      break;
    }
    return false;  // another marker inside the scan (DNL, a second scan, ...)
  }
  return L->ends.size() == total;
}

void build_sub_jpeg(const uint8_t* d, const RestartLayout& L, int row0, int row1, int group0,
                    int group1, std::vector<uint8_t>* out) {
  const int w = std::min(L.width - group0 * L.interval * L.mcu_width,
                         (group1 - group0 + 1) * L.interval * L.mcu_width);
  const int h = std::min(L.height - row0 * L.mcu_height, (row1 - row0 + 1) * L.mcu_height);
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
      out->insert(out->end(), d + L.starts[idx], d + L.ends[idx]);
      ++k;
    }
  }
  out->push_back(0xFF);
  out->push_back(0xD9);
}

// ---------------------------------------------------------------------------------------------
// Lossless transcode

namespace {

struct TranscodeJob {
  const uint8_t* data;
  size_t size;
  int restart_rows, restart_mcus;
  unsigned char* buffer;  // malloc'd by jpeg_mem_dest
  unsigned long out_size;
};

// setjmp frame: owns no destructible objects.
bool guarded_transcode(jpeg_decompress_struct* src, jpeg_compress_struct* dst, JpegErrorMgr* err,
                       TranscodeJob* job) {
  if (setjmp(err->jump)) return false;
  jpeg_create_decompress(src);
  jpeg_create_compress(dst);
  jpeg_mem_src(src, job->data, static_cast<unsigned long>(job->size));
  for (int m = 0; m < 16; ++m) jpeg_save_markers(src, JPEG_APP0 + m, 0xFFFF);
  jpeg_save_markers(src, JPEG_COM, 0xFFFF);
  jpeg_read_header(src, TRUE);
  jvirt_barray_ptr* coefficients = jpeg_read_coefficients(src);
  jpeg_copy_critical_parameters(src, dst);
  dst->optimize_coding = TRUE;
  dst->arith_code = FALSE;
  // Intervals of ~restart_mcus MCUs that tile each MCU row exactly (so crops can skip columns);
  // when the row length has no divisor in [target/2, target], whole rows.
  int interval = 0;
  if (job->restart_mcus > 0) {
    const int mcu_w = src->num_components == 1 ? 8 : 8 * src->max_h_samp_factor;
    const int per_row = static_cast<int>((src->image_width + mcu_w - 1) / mcu_w);
    for (int d = job->restart_mcus; d >= std::max(2, (job->restart_mcus + 1) / 2); --d)
      if (per_row % d == 0) {
        interval = d;
        break;
      }
  }
  if (interval > 0)
    dst->restart_interval = static_cast<unsigned int>(interval);
  else
    dst->restart_in_rows = job->restart_rows;
  jpeg_mem_dest(dst, &job->buffer, &job->out_size);
  // jpeg_write_coefficients writes JFIF/Adobe headers itself when the color space calls for them.
  const bool jfif = src->saw_JFIF_marker;
  dst->write_JFIF_header = jfif ? TRUE : FALSE;
  jpeg_write_coefficients(dst, coefficients);
  for (jpeg_saved_marker_ptr m = src->marker_list; m; m = m->next) {
    if (dst->write_JFIF_header && m->marker == JPEG_APP0 && m->data_length >= 5 &&
        std::memcmp(m->data, "JFIF", 5) == 0)
      continue;  // already written
    if (dst->write_Adobe_marker && m->marker == JPEG_APP0 + 14 && m->data_length >= 5 &&
        std::memcmp(m->data, "Adobe", 5) == 0)
      continue;
    jpeg_write_marker(dst, m->marker, m->data, m->data_length);
  }
  jpeg_finish_compress(dst);
  jpeg_finish_decompress(src);
  return true;
}

}  // namespace

std::vector<uint8_t> transcode_with_restarts(const uint8_t* data, size_t size, int restart_rows,
                                             int restart_mcus) {
  if (restart_rows < 1 && restart_mcus < 1) throw InvalidArgument("restart_rows or restart_mcus must be >= 1");
  jpeg_decompress_struct src;
  jpeg_compress_struct dst;
  std::memset(&src, 0, sizeof(src));
  std::memset(&dst, 0, sizeof(dst));
  JpegErrorMgr err;  // one manager for both objects: an error in either lands in the same frame
  install_error_mgr(&src, &err);
  dst.err = src.err;
  TranscodeJob job{data, size, restart_rows, restart_mcus, nullptr, 0};
  const bool ok = guarded_transcode(&src, &dst, &err, &job);
  jpeg_destroy_compress(&dst);
  jpeg_destroy_decompress(&src);
  std::vector<uint8_t> out;
  if (ok) out.assign(job.buffer, job.buffer + job.out_size);
  std::free(job.buffer);
  if (!ok) throw DecodeError(err.message);
  return out;
}

}  // namespace gpupipe
