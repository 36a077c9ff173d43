// Exception types of the C++ core and the one list of error kinds. The binding layer exports
// ErrorKind to Python (gpupipe._C.ErrorKind) and maps each kind to one Python class:
//   kInvalidArgument -> ValueError                    (the caller passed something wrong)
//   kNotJpeg         -> gpupipe.NotAJpegError         (no JPEG signature, empty input)
//   kCorrupt         -> gpupipe.CorruptJpegError      (libjpeg rejects the data; strict warnings)
//   kUnsupported     -> gpupipe.UnsupportedJpegError  (12-bit, lossless, hierarchical, odd color)
//   kPixelLimit      -> gpupipe.PixelLimitError       (max_pixels; a DecompressionBombError)
//   kScanLimit       -> gpupipe.ScanLimitError        (max_scans; a DecompressionBombError)
//   kMemoryLimit     -> gpupipe.MemoryLimitError      (max_memory; a DecompressionBombError)
//   kInternal        -> RuntimeError                  (a bug of ours, never the data's fault)
// kRead (the bytes could not be read) is produced by the Python loader, never by the core.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <tuple>

namespace gpupipe {

enum class ErrorKind : int {
  kNone = 0,
  kInvalidArgument = 1,
  kNotJpeg = 2,
  kCorrupt = 3,
  kUnsupported = 4,
  kPixelLimit = 5,
  kScanLimit = 6,
  kMemoryLimit = 7,
  kInternal = 8,
  kRead = 9,
};

inline bool is_limit(ErrorKind k) {
  return k == ErrorKind::kPixelLimit || k == ErrorKind::kScanLimit || k == ErrorKind::kMemoryLimit;
}

struct InvalidArgument : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// The data cannot be decoded (or is refused by a limit): `kind` says why.
struct DecodeError : std::runtime_error {
  DecodeError(ErrorKind k, const std::string& message) : std::runtime_error(message), kind(k) {}
  ErrorKind kind;
};

// A bug or a resource failure of ours (a thread that could not start, an impossible state).
struct InternalError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// (index, kind, message) of a sample that failed, as a batch call reports it.
using IndexedError = std::tuple<size_t, ErrorKind, std::string>;

}  // namespace gpupipe
