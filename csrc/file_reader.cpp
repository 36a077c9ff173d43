#include "file_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <new>

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

FileRead read_open_file(int fd, uint64_t max_size) {
  max_size = std::min<uint64_t>(max_size, static_cast<uint64_t>(PTRDIFF_MAX) - 1);  // max_size + 1 fits a size_t
  FileRead r;
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    r.error = errno;
    return r;
  }
  if (S_ISDIR(st.st_mode)) {
    r.error = EISDIR;
    return r;
  }
  if (!S_ISREG(st.st_mode)) {
    r.error = EINVAL;
    r.message = not_regular(st.st_mode);
    return r;
  }
  if (static_cast<uint64_t>(st.st_size) > max_size) {
    r.error = EFBIG;
    r.message = too_large(static_cast<uint64_t>(st.st_size), max_size, false);
    return r;
  }
  try {
    // The size is a hint (a file may change under us): one read of size + 1 finds the end at once.
    size_t used = 0;
    r.data.resize(static_cast<size_t>(st.st_size) + 1);
    for (;;) {
      if (used == r.data.size()) {
        if (used > max_size) {
          r.error = EFBIG;
          r.message = too_large(max_size, max_size, true);
          break;
        }
        r.data.resize(std::min<uint64_t>(max_size + 1, 2 * static_cast<uint64_t>(r.data.size())));
      }
      const ssize_t n = ::read(fd, &r.data[used], r.data.size() - used);
      if (n == 0) break;
      if (n < 0) {
        if (errno == EINTR) continue;
        r.error = errno;
        break;
      }
      used += static_cast<size_t>(n);
    }
    if (r.error) std::string().swap(r.data);
    else r.data.resize(used);
  } catch (const std::bad_alloc&) {
    r.data = std::string();
    r.error = ENOMEM;
  }
  return r;
}

}  // namespace

FileRead read_whole_file(const std::string& path, uint64_t max_size) {
  struct stat st;  // a special file is refused before it is opened (opening some devices acts)
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
    FileRead r;
    r.error = EINVAL;
    r.message = not_regular(st.st_mode);
    return r;
  }
  int fd;
  do {  // O_NONBLOCK: opening a FIFO must not wait for a writer (its kind is refused below)
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    FileRead r;
    r.error = errno;
    return r;
  }
  FileRead r = read_open_file(fd, max_size);
  ::close(fd);
  return r;
}

}  // namespace gpupipe
