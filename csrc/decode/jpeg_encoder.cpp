#include "decode/jpeg_encoder.h"

#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <jpeglib.h>

#include "common/errors.h"
#include "decode/jpeg_error.h"

namespace gpupipe {
namespace {

struct EncodeJob {
  const uint8_t* pixels;
  int height, width, channels;
  J_COLOR_SPACE in_space, jpeg_space;
  const EncodeOptions* options;
  unsigned char* buffer;  // malloc'd by jpeg_mem_dest
  unsigned long size;
};

// setjmp frame: owns no destructible objects.
bool guarded_encode(jpeg_compress_struct* cinfo, JpegErrorMgr* err, EncodeJob* job) {
  if (setjmp(err->jump)) return false;
  jpeg_create_compress(cinfo);
  jpeg_mem_dest(cinfo, &job->buffer, &job->size);
  cinfo->image_width = static_cast<JDIMENSION>(job->width);
  cinfo->image_height = static_cast<JDIMENSION>(job->height);
  cinfo->input_components = job->channels;
  cinfo->in_color_space = job->in_space;
  jpeg_set_defaults(cinfo);
  jpeg_set_colorspace(cinfo, job->jpeg_space);
  jpeg_set_quality(cinfo, job->options->quality, TRUE);
  if (!job->options->sampling.empty()) {
    for (int c = 0; c < cinfo->num_components; ++c) {
      cinfo->comp_info[c].h_samp_factor = job->options->sampling[c].first;
      cinfo->comp_info[c].v_samp_factor = job->options->sampling[c].second;
    }
  } else if (job->jpeg_space == JCS_YCbCr || job->jpeg_space == JCS_YCCK) {
    cinfo->comp_info[0].h_samp_factor = job->options->h_samp;
    cinfo->comp_info[0].v_samp_factor = job->options->v_samp;
    if (job->jpeg_space == JCS_YCCK) {  // K at full resolution, like Y
      cinfo->comp_info[3].h_samp_factor = job->options->h_samp;
      cinfo->comp_info[3].v_samp_factor = job->options->v_samp;
    }
  }
  cinfo->arith_code = job->options->arithmetic ? TRUE : FALSE;
  cinfo->optimize_coding = job->options->optimize && !job->options->arithmetic ? TRUE : FALSE;
  if (job->options->restart_blocks > 0)
    cinfo->restart_interval = static_cast<unsigned int>(job->options->restart_blocks);
  else
    cinfo->restart_in_rows = job->options->restart_rows;
  if (job->options->progressive) jpeg_simple_progression(cinfo);
  jpeg_start_compress(cinfo, TRUE);
  const size_t stride = static_cast<size_t>(job->width) * job->channels;
  while (cinfo->next_scanline < cinfo->image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(job->pixels + cinfo->next_scanline * stride);
    jpeg_write_scanlines(cinfo, &row, 1);
  }
  jpeg_finish_compress(cinfo);
  return true;
}

}  // namespace

void check_encode_input(size_t size, int height, int width, int channels) {
  if (size != static_cast<size_t>(height) * width * channels)
    throw InvalidArgument("pixels must hold height * width * channels bytes");
}

std::vector<uint8_t> encode_jpeg(const uint8_t* pixels, int height, int width, int channels,
                                 const EncodeOptions& options) {
  if (height < 1 || width < 1 || height > 65500 || width > 65500)
    throw InvalidArgument("image size must be within 1..65500");
  EncodeJob job{};
  job.pixels = pixels;
  job.height = height;
  job.width = width;
  job.channels = channels;
  job.options = &options;
  const std::string& cs = options.colorspace;
  if (channels == 3 && (cs == "ycbcr" || cs == "rgb" || cs == "gray")) {
    job.in_space = JCS_RGB;
    job.jpeg_space = cs == "ycbcr" ? JCS_YCbCr : cs == "rgb" ? JCS_RGB : JCS_GRAYSCALE;
  } else if (channels == 1 && cs == "gray") {
    job.in_space = JCS_GRAYSCALE;
    job.jpeg_space = JCS_GRAYSCALE;
  } else if (channels == 4 && (cs == "cmyk" || cs == "ycck")) {
    job.in_space = JCS_CMYK;
    job.jpeg_space = cs == "cmyk" ? JCS_CMYK : JCS_YCCK;
  } else {
    throw InvalidArgument("cannot encode " + std::to_string(channels) + " channels as '" + cs + "'");
  }
  if (options.h_samp < 1 || options.h_samp > 4 || options.v_samp < 1 || options.v_samp > 4)
    throw InvalidArgument("sampling factors must be within 1..4");
  if (!options.sampling.empty()) {
    const size_t comps = job.jpeg_space == JCS_GRAYSCALE ? 1 : job.jpeg_space == JCS_CMYK || job.jpeg_space == JCS_YCCK ? 4 : 3;
    if (options.sampling.size() != comps)
      throw InvalidArgument("sampling must give (h, v) for each of the " + std::to_string(comps) + " components");
    int blocks = 0;
    for (const auto& f : options.sampling) {
      if (f.first < 1 || f.first > 4 || f.second < 1 || f.second > 4)
        throw InvalidArgument("sampling factors must be within 1..4");
      blocks += f.first * f.second;
    }
    if (comps > 1 && blocks > 10)  // ITU T.81 B.2.3: at most 10 blocks in an interleaved MCU
      throw InvalidArgument("sampling has " + std::to_string(blocks) + " blocks per MCU, over the 10 a JPEG allows");
  }
  if (options.quality < 1 || options.quality > 100) throw InvalidArgument("quality must be within 1..100");
  if (options.restart_rows < 0 || options.restart_rows > 0xFFFF || options.restart_blocks < 0 ||
      options.restart_blocks > 0xFFFF)
    throw InvalidArgument("restart_rows and restart_blocks must be within 0..65535");

  jpeg_compress_struct cinfo;
  std::memset(&cinfo, 0, sizeof(cinfo));
  JpegErrorMgr err;
  install_error_mgr(reinterpret_cast<j_common_ptr>(&cinfo), &err);
  const bool ok = guarded_encode(&cinfo, &err, &job);
  jpeg_destroy_compress(&cinfo);
  std::vector<uint8_t> result;
  if (ok) result.assign(job.buffer, job.buffer + job.size);
  std::free(job.buffer);
  if (!ok) throw InternalError(std::string("JPEG encoding failed: ") + err.message);
  return result;
}

}  // namespace gpupipe
