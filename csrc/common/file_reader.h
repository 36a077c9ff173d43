// Whole-file reads for the Loader's read stage: a batch of paths read on a pool of threads, without
// the GIL and without a Python call per file.
#pragma once

#include <cstdint>
#include <string>

namespace gpupipe {

struct FileRead {
  std::string data;
  int error = 0;        // errno of the failed call (0: read); the data is then empty
  std::string message;  // why, when strerror(error) alone would not say it
};

// Reads the whole file at `path`. Only a regular file is read (a FIFO would block, a device such as
// /dev/zero never ends: they fail with EINVAL, a directory with EISDIR), and only up to `max_size`
// bytes (the max_file_size limit), checked from its size before reading and again while reading (a
// file that grows). Never throws: a failure, ENOMEM included, is the result's error.
FileRead read_whole_file(const std::string& path, uint64_t max_size);

// The same read in two halves, for a caller that allocates the destination in between (the bindings
// read straight into Python bytes objects, allocated with the GIL between two GIL-free passes).
struct OpenedFile {
  int fd = -1;          // closed by read_into, or by close_file on the way out
  uint64_t size = 0;    // its size when opened
  int error = 0;        // as FileRead's
  std::string message;
};
OpenedFile open_file(const std::string& path, uint64_t max_size);
// Reads the opened file's `size` bytes into dst and closes it. Returns the bytes read: fewer when the
// file shrank meanwhile; *grew is set when it has more (the caller then reads it whole again).
// A failed read sets file->error.
uint64_t read_into(OpenedFile* file, uint8_t* dst, bool* grew);
void close_file(OpenedFile* file);

}  // namespace gpupipe
