#include "storage/spill_writer.h"

#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/posix_error.h"

namespace tierd {
namespace {

constexpr uint64_t kWriteChunk = 4ull << 20;
constexpr unsigned kWritesInFlight = 8;
constexpr char kSpillSuffix[] = ".spill";

// Writes [data, data + bytes) at offset 0 of `fd` with io_uring, several chunks in flight. Never
// returns with a write still in flight: the memory and the file are released after it.
absl::Status WriteWithUring(FileSystem& file_system, struct io_uring* ring, int fd,
                            const uint8_t* data, uint64_t bytes, const std::string& path) {
  uint64_t next = 0;       // next offset to submit
  uint64_t completed = 0;  // bytes written
  unsigned in_flight = 0;
  absl::Status failure;
  while (completed < bytes && failure.ok()) {
    while (in_flight < kWritesInFlight && next < bytes) {
      failure = file_system.BeforeWrite(path);
      if (!failure.ok()) break;
      struct io_uring_sqe* sqe = io_uring_get_sqe(ring);
      const unsigned length = static_cast<unsigned>(std::min(kWriteChunk, bytes - next));
      io_uring_prep_write(sqe, fd, data + next, length, next);
      io_uring_sqe_set_data64(sqe, next | (static_cast<uint64_t>(length) << 40));
      next += length;
      ++in_flight;
    }
    if (in_flight == 0) break;  // the file system refused the next write: nothing to wait for
    if (int rc = io_uring_submit_and_wait(ring, 1); rc < 0 && rc != -EINTR) {
      failure = PosixError("io_uring_submit_and_wait", -rc);
      break;
    }
    struct io_uring_cqe* cqe;
    while (io_uring_peek_cqe(ring, &cqe) == 0) {
      const uint64_t tag = io_uring_cqe_get_data64(cqe);
      const uint64_t offset = tag & ((1ull << 40) - 1);
      const uint64_t length = tag >> 40;
      const int result = cqe->res;
      io_uring_cqe_seen(ring, cqe);
      --in_flight;
      if (!failure.ok()) continue;
      if (result == -EINTR || result == -EAGAIN || (result >= 0 && uint64_t(result) < length)) {
        // Write the rest synchronously: short writes are rare (a filling disk).
        for (uint64_t at = offset + (result > 0 ? uint64_t(result) : 0); at < offset + length;) {
          const ssize_t n = ::pwrite(fd, data + at, offset + length - at, at);
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) {
            failure = PosixError(absl::StrCat("writing ", path), n < 0 ? errno : ENOSPC);
            break;
          }
          at += uint64_t(n);
        }
      } else if (result < 0) {
        failure = PosixError(absl::StrCat("writing ", path), -result);
      }
      if (failure.ok()) completed += length;
    }
  }
  // Drain whatever is still in flight before the caller closes the file or frees the memory.
  struct io_uring_cqe* cqe;
  while (in_flight > 0 && io_uring_wait_cqe(ring, &cqe) == 0) {
    io_uring_cqe_seen(ring, cqe);
    --in_flight;
  }
  return failure;
}

absl::Status WriteWithPwrite(FileSystem& file_system, int fd, const uint8_t* data, uint64_t bytes,
                             const std::string& path) {
  for (uint64_t at = 0; at < bytes;) {
    if (absl::Status admitted = file_system.BeforeWrite(path); !admitted.ok()) return admitted;
    const ssize_t n = ::pwrite(fd, data + at, std::min(kWriteChunk, bytes - at), at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return PosixError(absl::StrCat("writing ", path), n < 0 ? errno : ENOSPC);
    at += uint64_t(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SpillWriter>> SpillWriter::Create(
    const std::string& directory, const SpillWriterOptions& options) {
  const std::shared_ptr<FileSystem> file_system = FileSystemOrDefault(options.file_system);
  if (absl::Status created = file_system->CreateDirectories(directory); !created.ok()) {
    return absl::Status(created.code(), absl::StrCat("spill directory: ", created.message()));
  }
  // Spilled objects do not outlive the daemon that spilled them.
  int removed = 0;
  const absl::StatusOr<std::vector<std::string>> names = file_system->ListDirectory(directory);
  for (const std::string& name : names.ok() ? *names : std::vector<std::string>()) {
    if (absl::EndsWith(name, kSpillSuffix) &&
        file_system->RemoveFile(absl::StrCat(directory, "/", name)).ok()) {
      ++removed;
    }
  }
  if (removed > 0)
    TIERD_LOG(INFO) << "removed " << removed << " old spill files from " << directory;
  std::unique_ptr<SpillWriter> writer(new SpillWriter(directory, file_system));
  writer->thread_ = std::thread([self = writer.get()] { self->Run(); });
  return writer;
}

SpillWriter::SpillWriter(std::string directory, std::shared_ptr<FileSystem> file_system)
    : directory_(std::move(directory)), file_system_(std::move(file_system)) {}

SpillWriter::~SpillWriter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void SpillWriter::Remove(const std::string& path) {
  if (absl::Status removed = file_system_->RemoveFile(path);
      !removed.ok() && !absl::IsNotFound(removed)) {
    TIERD_LOG(WARNING) << "spill file " << path << " not removed: " << removed;
  }
}

void SpillWriter::Write(SpillJob job) {
  absl::MutexLock lock(&mu_);
  jobs_.push_back(std::move(job));
}

void SpillWriter::Run() {
  for (;;) {
    SpillJob job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !jobs_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    absl::Status status = WriteFile(job);
    if (!status.ok()) (void)file_system_->RemoveFile(job.path);
    std::move(job.done)(status);
  }
}

absl::Status SpillWriter::WriteFile(const SpillJob& job) {
  OpenForWriteOptions open;
  open.direct = true;
  absl::StatusOr<ScopedFd> fd = file_system_->OpenForWrite(job.path, open);
  if (absl::IsInvalidArgument(fd.status())) {
    TIERD_LOG_FIRST_N(WARNING, 1) << "O_DIRECT refused in " << directory_
                                  << ": spilling through the page cache";
    open.direct = false;
    fd = file_system_->OpenForWrite(job.path, open);
  }
  if (!fd.ok()) return fd.status();
  struct io_uring ring;
  absl::Status status;
  if (io_uring_queue_init(kWritesInFlight, &ring, 0) == 0) {
    status = WriteWithUring(*file_system_, &ring, fd->get(), job.data, job.bytes, job.path);
    io_uring_queue_exit(&ring);
  } else {
    TIERD_LOG_FIRST_N(WARNING, 1) << "io_uring is unavailable: spilling with pwrite";
    status = WriteWithPwrite(*file_system_, fd->get(), job.data, job.bytes, job.path);
  }
  return status;
}

}  // namespace tierd
