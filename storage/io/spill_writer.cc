#include "storage/io/spill_writer.h"

#include <algorithm>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/posix_error.h"
#include "storage/io/detail/uring.h"

namespace tierd {
namespace {

constexpr uint64_t kWriteChunk = 4ull << 20;
constexpr int kWritesInFlight = 8;
constexpr char kSpillSuffix[] = ".spill";

// Writes [data, data + bytes) at offset 0 of `fd`, several chunks in flight. Never returns with a
// write still in flight: the memory and the file are released after it.
absl::Status WriteAll(FileSystem& file_system, Uring& uring, int fd, const uint8_t* data,
                      uint64_t bytes, const std::string& path) {
  std::vector<int> free_slots;
  for (int slot = uring.slots() - 1; slot >= 0; --slot) free_slots.push_back(slot);
  uint64_t next = 0;  // next offset to start
  absl::Status failure;
  for (;;) {
    while (failure.ok() && next < bytes && !free_slots.empty() && uring.CanStart()) {
      failure = file_system.BeforeWrite(path);
      if (!failure.ok()) break;
      UringTransfer write;
      write.kind = UringTransfer::Kind::kWrite;
      write.fd = fd;
      write.buffer = const_cast<uint8_t*>(data + next);  // only read
      write.length = std::min(kWriteChunk, bytes - next);
      write.offset = next;
      uring.Start(free_slots.back(), write);
      free_slots.pop_back();
      next += write.length;
    }
    // Done, or failed with nothing left in flight.
    if (uring.in_flight() == 0) return failure;
    uring.Reap([&](int slot, int error) {
      free_slots.push_back(slot);
      if (error < 0 && failure.ok()) failure = PosixError(absl::StrCat("writing ", path), -error);
    });
  }
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
  return std::unique_ptr<SpillWriter>(new SpillWriter(directory, file_system));
}

SpillWriter::SpillWriter(std::string directory, std::shared_ptr<FileSystem> file_system)
    : directory_(std::move(directory)), file_system_(std::move(file_system)) {}

SpillWriter::~SpillWriter() = default;

void SpillWriter::Remove(const std::string& path) {
  if (absl::Status removed = file_system_->RemoveFile(path);
      !removed.ok() && !absl::IsNotFound(removed)) {
    TIERD_LOG(WARNING) << "spill file " << path << " not removed: " << removed;
  }
}

void SpillWriter::Write(SpillJob job) {
  worker_.Post([this, job = std::move(job)]() mutable {
    absl::Status status = WriteFile(job);
    if (!status.ok()) (void)file_system_->RemoveFile(job.path);
    std::move(job.done)(status);
  });
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
  if (uring_ == nullptr) {
    // Made by the thread that drives it, at its first job.
    UringOptions options;
    options.slots = kWritesInFlight;
    absl::StatusOr<std::unique_ptr<Uring>> ring = Uring::Create(options);
    if (ring.ok()) {
      uring_ = *std::move(ring);
    } else {
      TIERD_LOG(WARNING) << "io_uring is unavailable (" << ring.status().message()
                         << "): spilling with pwrite";
      uring_ = Uring::Synchronous(kWritesInFlight);
    }
  }
  return WriteAll(*file_system_, *uring_, fd->get(), job.data, job.bytes, job.path);
}

}  // namespace tierd
