#include "storage/io/detail/memory_read.h"

#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/posix_error.h"

namespace tierd {

bool IsMemoryFileSystem(long f_type) { return f_type == TMPFS_MAGIC || f_type == RAMFS_MAGIC; }

bool IsMemoryBacked(int fd) {
  struct statfs fs;
  return ::fstatfs(fd, &fs) == 0 && IsMemoryFileSystem(fs.f_type);
}

absl::StatusOr<uint64_t> ReadInPieces(
    int fd, uint64_t offset, uint64_t length, uint8_t* destination,
    absl::FunctionRef<void(const uint8_t* piece, uint64_t bytes)> landed) {
  uint64_t done = 0;
  while (done < length) {
    const uint64_t want = std::min(kMemoryReadPieceBytes, length - done);
    const ssize_t n = ::pread(fd, destination + done, want, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return PosixError("pread", errno);
    }
    if (n == 0) break;  // the file ends here
    landed(destination + done, static_cast<uint64_t>(n));
    done += static_cast<uint64_t>(n);
  }
  return done;
}

}  // namespace tierd
