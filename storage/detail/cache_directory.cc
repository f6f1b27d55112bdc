#include "storage/detail/cache_directory.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <random>
#include <tuple>
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

absl::StatusOr<ScopedFd> OpenDirectoryAt(int parent, const std::string& name,
                                         const std::string& path) {
  if (::mkdirat(parent, name.c_str(), 0700) != 0 && errno != EEXIST) {
    return PosixError(absl::StrCat("creating ", path), errno);
  }
  ScopedFd fd(::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) return PosixError(absl::StrCat("opening ", path), errno);
  return fd;
}

// Removes every entry of the directory `fd` (its chunks, when rebuilding).
void RemoveEntries(int fd) {
  DIR* dir = ::fdopendir(::dup(fd));
  if (dir == nullptr) return;
  ::rewinddir(dir);  // the duplicate shares the offset an earlier listing left at the end
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') ::unlinkat(fd, entry->d_name, 0);
  }
  ::closedir(dir);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CacheDirectory>> CacheDirectory::Open(const std::string& path,
                                                                     uint64_t chunk_bytes) {
  if (path.empty()) return absl::InvalidArgumentError("a remote cache needs a directory");
  if (!ValidChunkBytes(chunk_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a remote cache's chunks must be ", kMinCacheChunkBytes >> 10, " KiB to ",
        kMaxCacheChunkBytes >> 20, " MiB, a multiple of 4 KiB; not ", chunk_bytes, " bytes"));
  }
  std::unique_ptr<CacheDirectory> dir(new CacheDirectory());
  dir->path_ = path;
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    return PosixError(absl::StrCat("creating the remote cache ", path), errno);
  }
  dir->dir_ = ScopedFd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (dir->dir_.get() < 0) {
    if (errno == ELOOP || errno == ENOTDIR) {
      return absl::PermissionDeniedError(absl::StrCat(
          "the remote cache ", path, " must be a directory, not a symbolic link or a file"));
    }
    return PosixError(absl::StrCat("opening the remote cache ", path), errno);
  }
  struct stat status = {};
  if (::fstat(dir->dir_.get(), &status) != 0) {
    return PosixError(absl::StrCat("the remote cache ", path), errno);
  }
  // Whoever can write here decides what clients are served as a remote model's bytes.
  if (status.st_uid != ::geteuid() || (status.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "the remote cache %s must belong to this user (uid %d) and be writable by it only "
        "(chmod 700)",
        path, ::geteuid()));
  }
  const int at = dir->dir_.get();
  ScopedFd lock(::openat(at, "lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (lock.get() < 0) return PosixError(absl::StrCat("creating ", path, "/lock"), errno);
  // One daemon at a time reads, makes or rebuilds the FORMAT and sweeps.
  while (::flock(lock.get(), LOCK_EX) != 0) {
    if (errno != EINTR) return PosixError(absl::StrCat("locking ", path, "/lock"), errno);
  }
  ASSIGN_OR_RETURN(dir->owners_, OpenDirectoryAt(at, "owners", absl::StrCat(path, "/owners")));
  ASSIGN_OR_RETURN(ScopedFd chunks, OpenDirectoryAt(at, "chunks", absl::StrCat(path, "/chunks")));
  dir->buckets_.reserve(256);
  for (int b = 0; b < 256; ++b) {
    const std::string name = absl::StrFormat("%02x", b);
    ASSIGN_OR_RETURN(ScopedFd bucket,
                     OpenDirectoryAt(chunks.get(), name, absl::StrCat(path, "/chunks/", name)));
    dir->buckets_.push_back(std::move(bucket));
  }

  // The FORMAT: made durably when missing; rebuilt when a crash left it empty or cut short, or
  // it is of version 1 (whose chunks this version does not read).
  char text[128] = {};
  size_t got = 0;
  ScopedFd format(::openat(at, "FORMAT", O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (format.get() >= 0) {
    ASSIGN_OR_RETURN(got, ReadUpTo(format.get(), text, sizeof(text) - 1, "FORMAT"));
  } else if (errno != ENOENT) {
    return PosixError(absl::StrCat("opening ", path, "/FORMAT"), errno);
  }
  absl::string_view line = absl::StripTrailingAsciiWhitespace(absl::string_view(text, got));
  // Empty or cut short before its number (the first version wrote it without fsync), or of the
  // first version.
  const bool torn = format.get() >= 0 &&
                    (absl::StartsWith(kFormatLine, line) || absl::StartsWith(line, kVersion1Line));
  if (format.get() < 0 || torn) {
    if (torn) {
      TIERD_LOG(WARNING) << "remote cache " << path << ": its FORMAT is "
                         << (line.empty() ? "empty" : "of an earlier version or cut short")
                         << "; rebuilding the cache";
      for (const ScopedFd& bucket : dir->buckets_) RemoveEntries(bucket.get());
    }
    const std::string temporary = absl::StrCat("FORMAT", kTemporaryMarker, ::getpid());
    ScopedFd out(::openat(at, temporary.c_str(),
                          O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (out.get() < 0) return PosixError(absl::StrCat("creating ", path, "/", temporary), errno);
    RETURN_IF_ERROR(WriteAll(out.get(), absl::StrCat(kFormatLine, chunk_bytes, "\n"), temporary));
    if (::fsync(out.get()) != 0) return PosixError(absl::StrCat("syncing ", temporary), errno);
    RETURN_IF_ERROR(out.Close(temporary));
    if (::renameat(at, temporary.c_str(), at, "FORMAT") != 0) {
      const int error = errno;
      ::unlinkat(at, temporary.c_str(), 0);
      return PosixError(absl::StrCat("creating ", path, "/FORMAT"), error);
    }
    if (::fsync(at) != 0) return PosixError(absl::StrCat("syncing ", path), errno);
    ::unlinkat(at, "usage", 0);  // counted afresh by the first sweep
    dir->chunk_bytes_ = chunk_bytes;
  } else {
    uint64_t bytes = 0;
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, kFormatLine) || !absl::SimpleAtoi(rest, &bytes)) {
      return absl::FailedPreconditionError(
          absl::StrCat(path,
                       "/FORMAT is not that of a remote cache this version of tierd knows; give "
                       "--remote-cache-dir an empty directory, or remove this one"));
    }
    if (!ValidChunkBytes(bytes)) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, "/FORMAT says chunks of ", bytes,
                       " bytes, which no remote cache has (", kMinCacheChunkBytes >> 10, " KiB to ",
                       kMaxCacheChunkBytes >> 20, " MiB); remove the directory"));
    }
    dir->chunk_bytes_ = bytes;
  }

  // This cache's owner file, locked for its life.
  std::mt19937_64 random(std::random_device{}());
  dir->owner_ = absl::StrFormat("%016x", random());
  dir->owner_lock_ = ScopedFd(::openat(dir->owners_.get(), dir->owner_.c_str(),
                                       O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (dir->owner_lock_.get() < 0 || ::flock(dir->owner_lock_.get(), LOCK_EX | LOCK_NB) != 0) {
    return PosixError(absl::StrCat("creating ", path, "/owners/", dir->owner_), errno);
  }
  return dir;
}

CacheDirectory::~CacheDirectory() {
  if (owner_lock_.get() >= 0) ::unlinkat(owners_.get(), owner_.c_str(), 0);
}

std::string CacheDirectory::Describe(int bucket, absl::string_view name) const {
  return absl::StrFormat("%s/chunks/%02x/%s", path_, bucket, name);
}

absl::StatusOr<ScopedFd> CacheDirectory::LockExclusive() const {
  ASSIGN_OR_RETURN(ScopedFd fd, OpenLockFile());
  while (::flock(fd.get(), LOCK_EX) != 0) {
    if (errno != EINTR) return PosixError(absl::StrCat("locking ", path_, "/lock"), errno);
  }
  return fd;
}

absl::StatusOr<ScopedFd> CacheDirectory::OpenLockFile() const {
  ScopedFd fd(::openat(dir_.get(), "lock", O_RDWR | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) return PosixError(absl::StrCat("opening ", path_, "/lock"), errno);
  return fd;
}

absl::StatusOr<uint64_t> CacheDirectory::AddUsage(int64_t delta) const {
  ScopedFd fd(::openat(dir_.get(), "usage", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (fd.get() < 0) return PosixError(absl::StrCat("opening ", path_, "/usage"), errno);
  // Held for a read and a write: no wait is ever long.
  RETURN_IF_ERROR(LockByte(fd.get(), 0, absl::InfiniteFuture(), [] { return false; }));
  uint64_t total = 0;
  const ssize_t read = ::pread(fd.get(), &total, sizeof(total), 0);
  if (read != static_cast<ssize_t>(sizeof(total))) total = 0;  // new, or torn: a sweep mends it
  if (delta < 0) {
    const uint64_t less = static_cast<uint64_t>(-(delta + 1)) + 1;
    total = total > less ? total - less : 0;
  } else {
    total += static_cast<uint64_t>(delta);
  }
  if (::pwrite(fd.get(), &total, sizeof(total), 0) != static_cast<ssize_t>(sizeof(total))) {
    return PosixError(absl::StrCat("writing ", path_, "/usage"), errno);
  }
  return total;
}

absl::StatusOr<std::pair<uint64_t, uint64_t>> CacheDirectory::Space() const {
  struct statvfs space = {};
  if (::fstatvfs(dir_.get(), &space) != 0) {
    return PosixError(absl::StrCat("the free space of ", path_), errno);
  }
  return std::make_pair(static_cast<uint64_t>(space.f_bavail) * space.f_frsize,
                        static_cast<uint64_t>(space.f_blocks) * space.f_frsize);
}

bool CacheDirectory::OwnerIsGone(absl::string_view owner) const {
  if (owner == owner_) return false;
  const std::string name(owner);
  ScopedFd fd(::openat(owners_.get(), name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) return errno == ENOENT;
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) return false;  // its cache holds it: alive
  ::unlinkat(owners_.get(), name.c_str(), 0);  // it was gone; the next sweep need not ask
  return true;
}

CacheSweep CacheDirectory::Sweep(uint64_t evict_to) const {
  struct Chunk {
    struct timespec used;
    uint64_t bytes;
    int bucket;
    std::string name;
  };
  std::vector<Chunk> chunks;
  std::map<std::string, bool> gone;  // owner → gone, asked once per sweep
  CacheSweep sweep;
  for (int b = 0; b < 256; ++b) {
    DIR* dir = ::fdopendir(::dup(buckets_[b].get()));
    if (dir == nullptr) continue;
    ::rewinddir(dir);  // the duplicate shares the offset the last sweep left at the end
    while (const dirent* entry = ::readdir(dir)) {
      if (entry->d_name[0] == '.') continue;
      struct stat status = {};
      if (::fstatat(buckets_[b].get(), entry->d_name, &status, AT_SYMLINK_NOFOLLOW) != 0 ||
          !S_ISREG(status.st_mode)) {
        continue;
      }
      const absl::string_view owner = OwnerOf(entry->d_name);
      if (!owner.empty()) {
        auto [it, asked] = gone.emplace(std::string(owner), false);
        if (asked) it->second = OwnerIsGone(owner);
        if (it->second) {
          if (::unlinkat(buckets_[b].get(), entry->d_name, 0) == 0) ++sweep.reaped;
        } else {
          sweep.bytes += status.st_size;  // a live cache's file, counted, never evicted here
        }
        continue;
      }
      if (absl::EndsWith(entry->d_name, kPendingSuffix) &&
          absl::TimeFromTimespec(status.st_mtim) + kPendingLifetime < absl::Now()) {
        if (::unlinkat(buckets_[b].get(), entry->d_name, 0) == 0) ++sweep.reaped;
        continue;
      }
      sweep.bytes += status.st_size;
      chunks.push_back({status.st_mtim, static_cast<uint64_t>(status.st_size), b, entry->d_name});
    }
    ::closedir(dir);
  }
  if (sweep.bytes > evict_to) {
    std::sort(chunks.begin(), chunks.end(), [](const Chunk& a, const Chunk& b) {
      return std::tie(a.used.tv_sec, a.used.tv_nsec) < std::tie(b.used.tv_sec, b.used.tv_nsec);
    });
    for (const Chunk& chunk : chunks) {
      if (sweep.bytes <= evict_to) break;
      if (::unlinkat(buckets_[chunk.bucket].get(), chunk.name.c_str(), 0) == 0) {
        sweep.bytes -= chunk.bytes;
        ++sweep.evicted;
      }
    }
  }
  // What the directory holds now, for every daemon sharing it.
  ScopedFd fd(::openat(dir_.get(), "usage", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (fd.get() >= 0 && LockByte(fd.get(), 0, absl::InfiniteFuture(), [] { return false; }).ok()) {
    if (::pwrite(fd.get(), &sweep.bytes, sizeof(sweep.bytes), 0) !=
        static_cast<ssize_t>(sizeof(sweep.bytes))) {
      TIERD_LOG(WARNING) << PosixError(absl::StrCat("writing ", path_, "/usage"), errno);
    }
  }
  return sweep;
}

}  // namespace tierd
