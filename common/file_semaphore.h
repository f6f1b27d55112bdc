// A counting semaphore shared by the processes of one user that open the same file: `count`
// slots, each one byte of the file that its holder locks with an open-file-description lock
// (fcntl F_OFD_SETLK). A slot is released when its holder lets it go, closes it or dies, so a
// crashed process never keeps one. Threads contend alike: each acquisition opens the file anew.
//
// Used to bound what the daemons of one node do at once (the remote reader's GETs).
// Thread-safe.
#ifndef TIERD_COMMON_FILE_SEMAPHORE_H_
#define TIERD_COMMON_FILE_SEMAPHORE_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/fd_io.h"

namespace tierd {

class FileSemaphore {
 public:
  // A slot held; released when this goes.
  class Slot {
   public:
    Slot(Slot&&) = default;
    Slot& operator=(Slot&&) = default;

   private:
    friend class FileSemaphore;
    explicit Slot(ScopedFd fd) : fd_(std::move(fd)) {}
    ScopedFd fd_;
  };

  // Opens (creating, mode 0600) the file at `path`, which must be a regular file of this user's
  // (PERMISSION_DENIED otherwise: whoever could lock its bytes could starve the holders).
  // INVALID_ARGUMENT for count < 1.
  static absl::StatusOr<std::unique_ptr<FileSemaphore>> Open(const std::string& path, int count);

  // A free slot, waiting for one when all are held, at most until `deadline` (DEADLINE_EXCEEDED)
  // and no longer than `stopped` says (CANCELLED). Errors: I/O errors of the file.
  absl::StatusOr<Slot> Acquire(
      absl::Time deadline = absl::InfiniteFuture(),
      absl::FunctionRef<bool()> stopped = [] { return false; });

  int count() const { return count_; }
  const std::string& path() const { return path_; }

 private:
  FileSemaphore(std::string path, int count) : path_(std::move(path)), count_(count) {}

  const std::string path_;
  const int count_;
  std::atomic<uint32_t> next_{0};  // where the next acquisition starts looking
};

}  // namespace tierd

#endif  // TIERD_COMMON_FILE_SEMAPHORE_H_
