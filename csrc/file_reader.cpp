#include "file_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <new>

namespace gpupipe {

FileRead read_whole_file(const std::string& path) {
  FileRead r;
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    r.error = errno;
    return r;
  }
  try {
    struct stat st;
    // The size is a hint (a file may change under us): one read of size + 1 finds the end at once.
    size_t capacity = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0
                          ? static_cast<size_t>(st.st_size) + 1
                          : size_t{1} << 16;
    size_t used = 0;
    r.data.resize(capacity);
    for (;;) {
      if (used == r.data.size()) r.data.resize(r.data.size() * 2);
      const ssize_t n = ::read(fd, &r.data[used], r.data.size() - used);
      if (n == 0) break;
      if (n < 0) {
        if (errno == EINTR) continue;
        r.error = errno;
        break;
      }
      used += static_cast<size_t>(n);
    }
    r.data.resize(r.error ? 0 : used);
  } catch (const std::bad_alloc&) {
    r.data = std::string();
    r.error = ENOMEM;
  }
  ::close(fd);
  return r;
}

}  // namespace gpupipe
