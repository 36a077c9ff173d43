// The one libjpeg error manager of the core (decoder, transcoder, encoder). libjpeg reports through
// it and never prints: an error longjmps back to the caller's setjmp frame with libjpeg's message
// and a kind derived from its msg_code; warnings (recoverable corruption) are recorded, and with
// `strict` the first one is an error; between progressive scans it refuses scan bombs (max_scans).
#pragma once

#include <csetjmp>
#include <cstdio>

#include <jpeglib.h>

#include "common/errors.h"

namespace gpupipe {

struct JpegErrorMgr {
  jpeg_error_mgr pub;
  jmp_buf jump;
  jpeg_progress_mgr progress;
  char message[JMSG_LENGTH_MAX + 200];  // the error, formatted
  char warning[JMSG_LENGTH_MAX];        // the first warning, formatted
  ErrorKind kind = ErrorKind::kNone;    // of the error in `message`
  bool strict = false;
  int max_scans = 0;                    // progressive scans allowed; 0: no limit
};

// Points cinfo->err at `mgr`. Call before jpeg_create_decompress / jpeg_create_compress.
void install_error_mgr(j_common_ptr cinfo, JpegErrorMgr* mgr);

// Enforces mgr->max_scans on a decompressor. Call after jpeg_create_decompress.
void watch_scans(j_decompress_ptr cinfo, JpegErrorMgr* mgr);

// Clears the recorded error and warnings before the next operation.
void reset_error_mgr(JpegErrorMgr* mgr, bool strict, int max_scans);

// Records an error of ours (not libjpeg's) to be thrown by throw_recorded.
void record_error(JpegErrorMgr* mgr, ErrorKind kind, const char* message);

// Throws the recorded error as DecodeError, with what the user can do where there is something.
[[noreturn]] void throw_recorded(const JpegErrorMgr& mgr);

}  // namespace gpupipe
