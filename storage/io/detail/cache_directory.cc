#include "storage/io/detail/cache_directory.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/byte_lock.h"
#include "common/log.h"
#include "common/posix_error.h"
#include "common/status_macros.h"

namespace tierd {
namespace {

// FORMAT's one line: this, the chunk size in bytes, a newline.
constexpr absl::string_view kFormatLine = "tierd remote cache 2 chunk_bytes=";
// The first version's line, whose chunks this version does not read: such a cache is rebuilt.
constexpr absl::string_view kVersion1Line = "tierd remote cache 1";
constexpr char kTemporaryMarker[] = ".tmp-";
constexpr absl::string_view kPendingSuffix = ".pending";
// A pending chunk is settled by the read it served within seconds; one older than this was left
// by a daemon that died first.
constexpr absl::Duration kPendingLifetime = absl::Minutes(10);

bool ValidChunkBytes(uint64_t bytes) {
  return bytes >= kMinCacheChunkBytes && bytes <= kMaxCacheChunkBytes && bytes % 4096 == 0;
}

// The owner a temporary file's name carries ("NAME.tmp-OWNER-N"), or "" for any other name.
absl::string_view OwnerOf(absl::string_view name) {
  const size_t at = name.find(kTemporaryMarker);
  if (at == absl::string_view::npos) return "";
  absl::string_view rest = name.substr(at + std::strlen(kTemporaryMarker));
  return rest.substr(0, rest.find('-'));
}

// Removes every entry of `dir` (its chunks, when rebuilding).
void RemoveEntries(FileSystem& file_system, const Directory& dir) {
  absl::StatusOr<std::vector<std::string>> names = file_system.ListAt(dir);
  if (!names.ok()) return;
  for (const std::string& name : *names) (void)file_system.RemoveAt(dir, name);
}

// Reads up to `size` bytes of `fd` (`path`) from its start, announced to the file system.
absl::StatusOr<size_t> ReadStart(FileSystem& file_system, int fd, const std::string& path,
                                 void* data, size_t size) {
  RETURN_IF_ERROR(file_system.BeforeRead(path));
  return ReadUpTo(fd, data, size, path);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CacheDirectory>> CacheDirectory::Open(
    const std::string& path, uint64_t chunk_bytes, std::shared_ptr<FileSystem> file_system) {
  if (path.empty()) return absl::InvalidArgumentError("a remote cache needs a directory");
  if (!ValidChunkBytes(chunk_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a remote cache's chunks must be ", kMinCacheChunkBytes >> 10, " KiB to ",
        kMaxCacheChunkBytes >> 20, " MiB, a multiple of 4 KiB; not ", chunk_bytes, " bytes"));
  }
  std::unique_ptr<CacheDirectory> dir(new CacheDirectory());
  dir->file_system_ = std::move(file_system);
  FileSystem& fs = *dir->file_system_;
  absl::StatusOr<Directory> top = fs.OpenDirectory(nullptr, path, /*create=*/true);
  if (absl::IsFailedPrecondition(top.status())) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the remote cache ", path, " must be a directory, not a symbolic link or a file"));
  }
  if (!top.ok()) {
    return absl::Status(top.status().code(),
                        absl::StrCat("the remote cache: ", top.status().message()));
  }
  dir->dir_ = *std::move(top);
  ASSIGN_OR_RETURN(const EntryStatus status, fs.StatAt(dir->dir_, "."));
  // Whoever can write here decides what clients are served as a remote model's bytes.
  if (status.owner != ::geteuid() || (status.mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "the remote cache %s must belong to this user (uid %d) and be writable by it only "
        "(chmod 700)",
        path, ::geteuid()));
  }
  ASSIGN_OR_RETURN(ScopedFd lock, fs.OpenAt(dir->dir_, "lock", O_RDWR | O_CREAT, 0600));
  // One daemon at a time reads, makes or rebuilds the FORMAT and sweeps.
  RETURN_IF_ERROR(fs.LockFile(lock.get(), dir->dir_.PathOf("lock"), LockWait::kWait));
  ASSIGN_OR_RETURN(dir->owners_, fs.OpenDirectory(&dir->dir_, "owners", /*create=*/true));
  ASSIGN_OR_RETURN(const Directory chunks, fs.OpenDirectory(&dir->dir_, "chunks", true));
  dir->buckets_.reserve(256);
  for (int b = 0; b < 256; ++b) {
    ASSIGN_OR_RETURN(Directory bucket,
                     fs.OpenDirectory(&chunks, absl::StrFormat("%02x", b), /*create=*/true));
    dir->buckets_.push_back(std::move(bucket));
  }
  RETURN_IF_ERROR(dir->OpenFormat(chunk_bytes));

  // This cache's owner file, locked for its life.
  std::mt19937_64 random(std::random_device{}());
  dir->owner_ = absl::StrFormat("%016x", random());
  ASSIGN_OR_RETURN(dir->owner_lock_,
                   fs.OpenAt(dir->owners_, dir->owner_, O_RDWR | O_CREAT | O_EXCL, 0600));
  RETURN_IF_ERROR(
      fs.LockFile(dir->owner_lock_.get(), dir->owners_.PathOf(dir->owner_), LockWait::kFailIfHeld));
  return dir;
}

absl::Status CacheDirectory::OpenFormat(uint64_t chunk_bytes) {
  // The FORMAT: made durably when missing; rebuilt when a crash left it empty or cut short, or
  // it is of version 1 (whose chunks this version does not read).
  FileSystem& fs = *file_system_;
  const std::string format_path = dir_.PathOf("FORMAT");
  char text[128] = {};
  size_t got = 0;
  absl::StatusOr<ScopedFd> format = fs.OpenAt(dir_, "FORMAT", O_RDONLY, 0);
  if (format.ok()) {
    ASSIGN_OR_RETURN(got, ReadStart(fs, format->get(), format_path, text, sizeof(text) - 1));
  } else if (!absl::IsNotFound(format.status())) {
    return format.status();
  }
  const absl::string_view line = absl::StripTrailingAsciiWhitespace(absl::string_view(text, got));
  if (format.ok() && !absl::StartsWith(kFormatLine, line) &&
      !absl::StartsWith(line, kVersion1Line)) {
    uint64_t bytes = 0;
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, kFormatLine) || !absl::SimpleAtoi(rest, &bytes)) {
      return absl::FailedPreconditionError(absl::StrCat(
          format_path,
          " is not that of a remote cache this version of tierd knows; give --remote-cache-dir an "
          "empty directory, or remove this one"));
    }
    if (!ValidChunkBytes(bytes)) {
      return absl::FailedPreconditionError(
          absl::StrCat(format_path, " says chunks of ", bytes,
                       " bytes, which no remote cache has (", kMinCacheChunkBytes >> 10, " KiB to ",
                       kMaxCacheChunkBytes >> 20, " MiB); remove the directory"));
    }
    chunk_bytes_ = bytes;
    return absl::OkStatus();
  }
  // Empty or cut short before its number (the first version wrote it without fsync), or of the
  // first version: rebuilt.
  if (format.ok()) {
    TIERD_LOG(WARNING) << "remote cache " << dir_.path << ": its FORMAT is "
                       << (line.empty() ? "empty" : "of an earlier version or cut short")
                       << "; rebuilding the cache";
    for (const Directory& bucket : buckets_) RemoveEntries(fs, bucket);
  }
  const std::string temporary = absl::StrCat("FORMAT", kTemporaryMarker, ::getpid());
  const std::string temporary_path = dir_.PathOf(temporary);
  absl::Status written = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(ScopedFd out, fs.OpenAt(dir_, temporary, O_WRONLY | O_CREAT | O_TRUNC, 0600));
    RETURN_IF_ERROR(fs.BeforeWrite(temporary_path));
    RETURN_IF_ERROR(
        WriteAll(out.get(), absl::StrCat(kFormatLine, chunk_bytes, "\n"), temporary_path));
    RETURN_IF_ERROR(fs.SyncFile(out.get(), temporary_path));
    RETURN_IF_ERROR(out.Close(temporary_path));
    return fs.RenameAt(dir_, temporary, "FORMAT");
  }();
  if (!written.ok()) {
    (void)fs.RemoveAt(dir_, temporary);
    return written;
  }
  RETURN_IF_ERROR(fs.SyncDirectoryAt(dir_));
  (void)fs.RemoveAt(dir_, "usage");  // counted afresh by the first sweep
  chunk_bytes_ = chunk_bytes;
  return absl::OkStatus();
}

CacheDirectory::~CacheDirectory() {
  if (owner_lock_.get() >= 0) (void)file_system_->RemoveAt(owners_, owner_);
}

std::string CacheDirectory::Describe(int bucket, absl::string_view name) const {
  return absl::StrFormat("%s/chunks/%02x/%s", dir_.path, bucket, name);
}

absl::StatusOr<ScopedFd> CacheDirectory::LockExclusive() const {
  ASSIGN_OR_RETURN(ScopedFd fd, OpenLockFile());
  RETURN_IF_ERROR(file_system_->LockFile(fd.get(), dir_.PathOf("lock"), LockWait::kWait));
  return fd;
}

absl::StatusOr<ScopedFd> CacheDirectory::OpenLockFile() const {
  return file_system_->OpenAt(dir_, "lock", O_RDWR, 0);
}

absl::StatusOr<uint64_t> CacheDirectory::AddUsage(int64_t delta) const {
  const std::string path = dir_.PathOf("usage");
  ASSIGN_OR_RETURN(ScopedFd fd, file_system_->OpenAt(dir_, "usage", O_RDWR | O_CREAT, 0600));
  // Held for a read and a write: no wait is ever long.
  RETURN_IF_ERROR(LockByte(fd.get(), 0, absl::InfiniteFuture(), [] { return false; }));
  uint64_t total = 0;
  RETURN_IF_ERROR(file_system_->BeforeRead(path));
  const ssize_t read = ::pread(fd.get(), &total, sizeof(total), 0);
  if (read != static_cast<ssize_t>(sizeof(total))) total = 0;  // new, or torn: a sweep mends it
  if (delta < 0) {
    const uint64_t less = static_cast<uint64_t>(-(delta + 1)) + 1;
    total = total > less ? total - less : 0;
  } else {
    total += static_cast<uint64_t>(delta);
  }
  RETURN_IF_ERROR(WriteUsage(fd.get(), total));
  return total;
}

absl::Status CacheDirectory::WriteUsage(int fd, uint64_t total) const {
  const std::string path = dir_.PathOf("usage");
  RETURN_IF_ERROR(file_system_->BeforeWrite(path));
  if (::pwrite(fd, &total, sizeof(total), 0) != static_cast<ssize_t>(sizeof(total))) {
    return PosixError(absl::StrCat("writing ", path), errno);
  }
  return absl::OkStatus();
}

absl::StatusOr<FileSystemSpace> CacheDirectory::Space() const { return file_system_->Space(dir_); }

bool CacheDirectory::OwnerIsGone(absl::string_view owner) const {
  if (owner == owner_) return false;
  const std::string name(owner);
  absl::StatusOr<ScopedFd> fd = file_system_->OpenAt(owners_, name, O_RDWR, 0);
  if (!fd.ok()) return absl::IsNotFound(fd.status());
  // Held: its cache lives.
  if (!file_system_->LockFile(fd->get(), owners_.PathOf(name), LockWait::kFailIfHeld).ok()) {
    return false;
  }
  (void)file_system_->RemoveAt(owners_, name);  // it was gone; the next sweep need not ask
  return true;
}

CacheSweep CacheDirectory::Sweep(uint64_t evict_to) const {
  struct Chunk {
    absl::Time used;
    uint64_t bytes;
    int bucket;
    std::string name;
  };
  FileSystem& fs = *file_system_;
  std::vector<Chunk> chunks;
  std::map<std::string, bool> gone;  // owner → gone, asked once per sweep
  CacheSweep sweep;
  for (int b = 0; b < 256; ++b) {
    absl::StatusOr<std::vector<std::string>> names = fs.ListAt(buckets_[b]);
    if (!names.ok()) continue;
    for (const std::string& name : *names) {
      if (name[0] == '.') continue;
      absl::StatusOr<EntryStatus> status = fs.StatAt(buckets_[b], name);
      if (!status.ok() || !status->regular) continue;
      const absl::string_view owner = OwnerOf(name);
      if (!owner.empty()) {
        auto [it, asked] = gone.emplace(std::string(owner), false);
        if (asked) it->second = OwnerIsGone(owner);
        if (it->second) {
          if (fs.RemoveAt(buckets_[b], name).ok()) ++sweep.reaped;
        } else {
          sweep.bytes += status->size;  // a live cache's file, counted, never evicted here
        }
        continue;
      }
      if (absl::EndsWith(name, kPendingSuffix) &&
          status->modified + kPendingLifetime < absl::Now()) {
        if (fs.RemoveAt(buckets_[b], name).ok()) ++sweep.reaped;
        continue;
      }
      sweep.bytes += status->size;
      chunks.push_back({status->modified, status->size, b, name});
    }
  }
  if (sweep.bytes > evict_to) {
    std::sort(chunks.begin(), chunks.end(),
              [](const Chunk& a, const Chunk& b) { return a.used < b.used; });
    for (const Chunk& chunk : chunks) {
      if (sweep.bytes <= evict_to) break;
      if (fs.RemoveAt(buckets_[chunk.bucket], chunk.name).ok()) {
        sweep.bytes -= chunk.bytes;
        ++sweep.evicted;
      }
    }
  }
  // What the directory holds now, for every daemon sharing it.
  absl::StatusOr<ScopedFd> fd = fs.OpenAt(dir_, "usage", O_RDWR | O_CREAT, 0600);
  if (fd.ok() && LockByte(fd->get(), 0, absl::InfiniteFuture(), [] { return false; }).ok()) {
    if (absl::Status written = WriteUsage(fd->get(), sweep.bytes); !written.ok()) {
      TIERD_LOG(WARNING) << written;
    }
  }
  return sweep;
}

}  // namespace tierd
