// Whole-file reads for the Loader's read stage: a batch of paths read on a pool of threads, without
// the GIL and without a Python call per file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

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

class ThreadPool;

// A batch of whole-file reads on a pool of I/O threads, a chunk of files at a time (a large batch
// never holds more descriptors than that), for a caller that allocates each file's destination
// between a chunk's two passes: open() sizes the files, read() reads them into the caller's memory.
// Both passes run without the GIL; the allocations in between with it.
class FileBatch {
 public:
  static constexpr size_t kChunk = 256;

  // Throws InvalidArgument unless num_threads is in [1, kMaxThreads]; with one thread, or one file,
  // the calling thread reads. `paths` must outlive the batch.
  FileBatch(const std::vector<std::string>& paths, int num_threads, uint64_t max_size);
  FileBatch(const FileBatch&) = delete;
  FileBatch& operator=(const FileBatch&) = delete;
  ~FileBatch();  // closes what is still open

  // Opens and sizes files [first, first + count), count <= kChunk: the chunk's files()[k] is file
  // first + k (an error of its own, or open with its size).
  void open(size_t first, size_t count);
  const std::vector<OpenedFile>& files() const { return files_; }
  // Reads every chunk file opened without an error into dst[k], which holds its size, and closes
  // it: got(k) bytes (fewer when it shrank meanwhile), grew(k) when it has more.
  void read(const std::vector<uint8_t*>& dst);
  uint64_t got(size_t k) const { return got_[k]; }
  bool grew(size_t k) const { return grew_[k] != 0; }
  // Chunk file k read whole again (one that grew while read, as one file).
  FileRead reread(size_t k) const;
  // Chunk file k fails with `error` and `message` (closed, never read): a batch's byte budget.
  void refuse(size_t k, int error, std::string message);
  // Closes the chunk's files still open (on the way out of a failed allocation).
  void close();

 private:
  void each(size_t count, const std::function<void(size_t)>& fn);

  const std::vector<std::string>& paths_;
  uint64_t max_size_;
  std::shared_ptr<ThreadPool> pool_;
  size_t first_ = 0;
  std::vector<OpenedFile> files_;
  std::vector<uint64_t> got_;
  std::vector<char> grew_;
};

}  // namespace gpupipe
