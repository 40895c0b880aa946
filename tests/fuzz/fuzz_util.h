// Small helpers shared by the fuzz targets (tests/fuzz).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace kvstream::fuzz {

// Stops the run with a message: libFuzzer saves the input that got here as a crash.
[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what.c_str());
  std::abort();
}

// A file with exactly `bytes`, for parsers that read from a path: a memfd, named by its
// /proc/self/fd path; closed when the object goes.
class MemFile {
 public:
  explicit MemFile(std::string_view bytes) {
    fd_ = memfd_create("kvstream-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) Fail("memfd_create");
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = write(fd_, bytes.data() + done, bytes.size() - done);
      if (n <= 0) Fail("write to memfd");
      done += static_cast<size_t>(n);
    }
  }
  ~MemFile() { close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_ = -1;
};

}  // namespace kvstream::fuzz
