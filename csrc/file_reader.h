// Whole-file reads for the Loader's read stage: a batch of paths read on a pool of threads, without
// the GIL and without a Python call per file.
#pragma once

#include <string>

namespace gpupipe {

struct FileRead {
  std::string data;
  int error = 0;  // errno of the failed call (0: read); the data is then empty
};

// Reads the whole file at `path` (until end of file, whatever its size said). Never throws: an
// open/read failure or an allocation failure (ENOMEM) is the result's error.
FileRead read_whole_file(const std::string& path);

}  // namespace gpupipe
