#include "common/file_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <new>
#include <string>
#include <utility>

#include "common/errors.h"
#include "common/thread_pool.h"

namespace gpupipe {

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

std::string not_regular(mode_t mode) { return std::string(kind_of(mode)) + ", not a regular file: not read"; }

std::string too_large(uint64_t size, uint64_t max_size, bool at_least) {
  return std::string("the file is ") + (at_least ? "over " : "") + std::to_string(size) +
         " bytes, over the max_file_size limit of " + std::to_string(max_size) +
         " (gpupipe.set_limits(max_file_size=...) raises it)";
}

uint64_t clamp(uint64_t max_size) {  // max_size + 1 fits a size_t
  return std::min<uint64_t>(max_size, static_cast<uint64_t>(PTRDIFF_MAX) - 1);
}

}  // namespace

OpenedFile open_file(const std::string& path, uint64_t max_size) {
  max_size = clamp(max_size);
  OpenedFile f;
  struct stat st;  // a special file is refused before it is opened (opening some devices acts)
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
    f.error = EINVAL;
    f.message = not_regular(st.st_mode);
    return f;
  }
  do {  // O_NONBLOCK: opening a FIFO must not wait for a writer (its kind is refused below)
    f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  } while (f.fd < 0 && errno == EINTR);
  if (f.fd < 0) {
    f.error = errno;
    return f;
  }
  if (::fstat(f.fd, &st) != 0) f.error = errno;
  else if (S_ISDIR(st.st_mode)) f.error = EISDIR;
  else if (!S_ISREG(st.st_mode)) {
    f.error = EINVAL;
    f.message = not_regular(st.st_mode);
  } else if (static_cast<uint64_t>(st.st_size) > max_size) {
    f.error = EFBIG;
    f.message = too_large(static_cast<uint64_t>(st.st_size), max_size, false);
  }
  if (f.error) close_file(&f);
  else f.size = static_cast<uint64_t>(st.st_size);
  return f;
}

void close_file(OpenedFile* f) {
  if (f->fd >= 0) ::close(f->fd);
  f->fd = -1;
}

namespace {
// read() until `n` bytes or the end; the bytes read, or -1 with errno.
int64_t read_fully(int fd, uint8_t* dst, uint64_t n) {
  uint64_t used = 0;
  while (used < n) {
    const ssize_t got = ::read(fd, dst + used, n - used);
    if (got == 0) break;
    if (got < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    used += static_cast<uint64_t>(got);
  }
  return static_cast<int64_t>(used);
}
}  // namespace

uint64_t read_into(OpenedFile* f, uint8_t* dst, bool* grew) {
  *grew = false;
  const int64_t got = read_fully(f->fd, dst, f->size);
  uint8_t probe;
  if (got < 0) f->error = errno;
  else if (static_cast<uint64_t>(got) == f->size) {
    const int64_t more = read_fully(f->fd, &probe, 1);
    if (more < 0) f->error = errno;
    else *grew = more > 0;
  }
  close_file(f);
  return got < 0 ? 0 : static_cast<uint64_t>(got);
}

FileRead read_whole_file(const std::string& path, uint64_t max_size) {
  max_size = clamp(max_size);
  OpenedFile f = open_file(path, max_size);
  FileRead r;
  r.error = f.error;
  r.message = std::move(f.message);
  if (r.error) return r;
  try {
    // The size is a hint (a file may change under us): one read of size + 1 finds the end at once.
    r.data.resize(static_cast<size_t>(f.size) + 1);
    size_t used = 0;
    for (;;) {
      if (used == r.data.size()) {
        if (used > max_size) {
          r.error = EFBIG;
          r.message = too_large(max_size, max_size, true);
          break;
        }
        r.data.resize(std::min<uint64_t>(max_size + 1, 2 * static_cast<uint64_t>(r.data.size())));
      }
      const int64_t n = read_fully(f.fd, reinterpret_cast<uint8_t*>(&r.data[used]), r.data.size() - used);
      if (n < 0) {
        r.error = errno;
        break;
      }
      used += static_cast<size_t>(n);
      if (used < r.data.size()) break;  // the end
    }
    if (r.error) std::string().swap(r.data);
    else r.data.resize(used);
  } catch (const std::bad_alloc&) {
    r.data = std::string();
    r.error = ENOMEM;
  }
  close_file(&f);
  return r;
}

FileBatch::FileBatch(const std::vector<std::string>& paths, int num_threads, uint64_t max_size)
    : paths_(paths), max_size_(max_size) {
  if (num_threads < 1 || num_threads > kMaxThreads)
    throw InvalidArgument("num_threads must be in [1, " + std::to_string(kMaxThreads) + "]");
  if (num_threads != 1 && paths.size() > 1) pool_ = get_pool(num_threads, PoolUse::kIo);
}

FileBatch::~FileBatch() { close(); }

void FileBatch::each(size_t count, const std::function<void(size_t)>& fn) {
  if (pool_) pool_->parallel_for(count, fn);
  else for (size_t k = 0; k < count; ++k) fn(k);
}

void FileBatch::open(size_t first, size_t count) {
  close();
  first_ = first;
  files_.assign(count, OpenedFile());
  each(count, [&](size_t k) { files_[k] = open_file(paths_[first + k], max_size_); });
}

void FileBatch::read(const std::vector<uint8_t*>& dst) {
  got_.assign(files_.size(), 0);
  grew_.assign(files_.size(), 0);
  each(files_.size(), [&](size_t k) {
    if (files_[k].error) return;
    bool more = false;
    got_[k] = read_into(&files_[k], dst[k], &more);
    grew_[k] = more;
  });
}

FileRead FileBatch::reread(size_t k) const { return read_whole_file(paths_[first_ + k], max_size_); }

void FileBatch::refuse(size_t k, int error, std::string message) {
  close_file(&files_[k]);
  files_[k].error = error;
  files_[k].message = std::move(message);
}

void FileBatch::close() {
  for (OpenedFile& f : files_) close_file(&f);
}

}  // namespace gpupipe
