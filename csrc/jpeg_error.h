// The plain libjpeg error manager: an error longjmps back to the caller's setjmp with libjpeg's
// message formatted. Used where warnings need no handling (encoding, transcoding); the decoder has
// its own, which also records warnings and enforces the scan limit.
#pragma once

#include <csetjmp>
#include <cstdio>

#include <jpeglib.h>

namespace gpupipe {

struct JpegErrorMgr {
  jpeg_error_mgr pub;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

// Points cinfo->err at `mgr` (standard handlers, error_exit replaced).
template <typename Cinfo>
void install_error_mgr(Cinfo* cinfo, JpegErrorMgr* mgr) {
  cinfo->err = jpeg_std_error(&mgr->pub);
  mgr->pub.error_exit = [](j_common_ptr c) {
    auto* e = reinterpret_cast<JpegErrorMgr*>(c->err);
    (*c->err->format_message)(c, e->message);
    longjmp(e->jump, 1);
  };
}

}  // namespace gpupipe
