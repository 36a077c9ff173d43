#include "decode/jpeg_error.h"

#include <cstring>
#include <string>

#include <jerror.h>

namespace gpupipe {
namespace {

JpegErrorMgr* mgr_of(j_common_ptr cinfo) { return reinterpret_cast<JpegErrorMgr*>(cinfo->err); }

ErrorKind kind_of(int code) {
  switch (code) {
    case JERR_NO_SOI:
    case JERR_INPUT_EMPTY:
      return ErrorKind::kNotJpeg;
    case JERR_BAD_PRECISION:
    case JERR_SOF_UNSUPPORTED:
    case JERR_NOT_COMPILED:
    case JERR_CONVERSION_NOTIMPL:
    case JERR_ARITH_NOTIMPL:
    case JERR_FRACT_SAMPLE_NOTIMPL:  // legal (non-integral ratios), not implemented by libjpeg
    case JERR_IMAGE_TOO_BIG:    // over libjpeg's 65500-pixel dimension
    case JERR_WIDTH_OVERFLOW:
      return ErrorKind::kUnsupported;
    case JERR_NO_BACKING_STORE:
    case JERR_OUT_OF_MEMORY:
      return ErrorKind::kMemoryLimit;
    default:
      return ErrorKind::kCorrupt;
  }
}

void on_error_exit(j_common_ptr cinfo) {
  JpegErrorMgr* e = mgr_of(cinfo);
  (*cinfo->err->format_message)(cinfo, e->message);
  e->kind = kind_of(cinfo->err->msg_code);
  longjmp(e->jump, 1);
}

// Trace messages (level >= 0) are dropped; warnings (level -1) are recorded, or fatal when strict.
void on_emit_message(j_common_ptr cinfo, int level) {
  if (level >= 0) return;
  JpegErrorMgr* e = mgr_of(cinfo);
  if (e->pub.num_warnings++ == 0) (*cinfo->err->format_message)(cinfo, e->warning);
  if (e->strict) {
    char text[JMSG_LENGTH_MAX];
    (*cinfo->err->format_message)(cinfo, text);
    std::snprintf(e->message, sizeof(e->message), "%s (strict=True turns this warning into an error)", text);
    e->kind = ErrorKind::kCorrupt;
    longjmp(e->jump, 1);
  }
}

void on_output_message(j_common_ptr) {}  // never print (libjpeg's default writes to stderr)

// Called by libjpeg between scans: refuses progressive "scan bombs" (thousands of tiny scans that
// each cost a pass over the whole coefficient buffer), like libjpeg-turbo's own fuzz targets.
void on_progress(j_common_ptr cinfo) {
  if (!cinfo->is_decompressor) return;
  JpegErrorMgr* e = mgr_of(cinfo);
  const int scans = reinterpret_cast<j_decompress_ptr>(cinfo)->input_scan_number;
  if (e->max_scans > 0 && scans > e->max_scans) {
    std::snprintf(e->message, sizeof(e->message),
                  "JPEG has more than max_scans=%d scans: refused as a possible scan bomb "
                  "(gpupipe.set_limits(max_scans=...) raises the limit)",
                  e->max_scans);
    e->kind = ErrorKind::kScanLimit;
    longjmp(e->jump, 1);
  }
}

}  // namespace

void install_error_mgr(j_common_ptr cinfo, JpegErrorMgr* mgr) {
  cinfo->err = jpeg_std_error(&mgr->pub);
  mgr->pub.error_exit = on_error_exit;
  mgr->pub.emit_message = on_emit_message;
  mgr->pub.output_message = on_output_message;
  mgr->progress.progress_monitor = on_progress;
  reset_error_mgr(mgr, false, 0);
}

void watch_scans(j_decompress_ptr cinfo, JpegErrorMgr* mgr) { cinfo->progress = &mgr->progress; }

void reset_error_mgr(JpegErrorMgr* mgr, bool strict, int max_scans) {
  mgr->pub.num_warnings = 0;
  mgr->pub.msg_code = 0;
  mgr->message[0] = '\0';
  mgr->warning[0] = '\0';
  mgr->kind = ErrorKind::kNone;
  mgr->strict = strict;
  mgr->max_scans = max_scans;
}

void record_error(JpegErrorMgr* mgr, ErrorKind kind, const char* message) {
  std::snprintf(mgr->message, sizeof(mgr->message), "%s", message);
  mgr->kind = kind;
}

void throw_recorded(const JpegErrorMgr& mgr) {
  std::string m = mgr.message[0] ? mgr.message : "JPEG decoder failed without a message";
  const ErrorKind kind = mgr.kind == ErrorKind::kNone ? ErrorKind::kCorrupt : mgr.kind;
  const int code = mgr.pub.msg_code;
  if (kind == ErrorKind::kUnsupported && code == JERR_BAD_PRECISION && mgr.pub.msg_parm.i[0] == 12) {
    m += " (12-bit JPEG: this libjpeg-turbo build decodes 8-bit JPEGs only; convert the file, e.g. with "
         "Pillow or ImageMagick)";
  } else if (kind == ErrorKind::kUnsupported && code == JERR_SOF_UNSUPPORTED) {
    const int sof = mgr.pub.msg_parm.i[0];
    if (sof == 0xC3 || sof == 0xC7 || sof == 0xCB || sof == 0xCF)
      m += " (lossless JPEG is not supported by libjpeg-turbo 2.x)";
    else
      m += " (hierarchical JPEG is not supported by libjpeg-turbo)";
  } else if (kind == ErrorKind::kMemoryLimit) {
    m += " (the decode needs more working memory than max_memory; gpupipe.set_limits(max_memory=...) raises "
         "the limit)";
  }
  throw DecodeError(kind, m);
}

}  // namespace gpupipe
