// Exception types of the C++ core. The binding layer maps each to a Python class:
//   InvalidArgument -> ValueError          (the caller passed something wrong)
//   DecodeError     -> gpupipe.JpegError   (the data is not a decodable JPEG)
//   TooLarge        -> gpupipe.DecompressionBombError (refused by a limit)
// Anything else escaping the core is an internal bug and surfaces as RuntimeError.
#pragma once

#include <stdexcept>
#include <string>

namespace gpupipe {

struct InvalidArgument : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

struct DecodeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct TooLarge : DecodeError {
  using DecodeError::DecodeError;
};

}  // namespace gpupipe
