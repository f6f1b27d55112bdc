// The memory behind a host arena: one mapping, huge page aligned (arena_pages.h), of private
// anonymous memory or of a POSIX shared memory object that the other daemons of the node map by
// its name (HostArenaOptions::shared). Internal to storage/host/host_arena.cc and
// storage/host/detail/arena_pinner.cc.
//
// A shared object is sized to the whole arena when it is made but takes no memory yet: an arena
// can be hundreds of GiB, pinned piece by piece in the background. Reserve backs a piece with
// memory (posix_fallocate) before the piece is touched, so that a /dev/shm too small for the arena
// fails that piece with RESOURCE_EXHAUSTED instead of killing the process with SIGBUS.
//
// Thread-safe.
#ifndef TIERD_STORAGE_HOST_DETAIL_ARENA_REGION_H_
#define TIERD_STORAGE_HOST_DETAIL_ARENA_REGION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tierd {

class ArenaRegion {
 public:
  // Maps `bytes` (> 0, a multiple of the page size) of private anonymous memory.
  // Errors: MapArenaRegion's.
  static absl::StatusOr<std::unique_ptr<ArenaRegion>> MapPrivate(uint64_t bytes);
  // Creates the shared memory object `name` (O_EXCL, mode 0600) of `bytes` (> 0, a multiple of the
  // page size) with nothing reserved, and maps it read-write. Errors: ALREADY_EXISTS when the name
  // is taken, INVALID_ARGUMENT for a bad name, RESOURCE_EXHAUSTED when it cannot be mapped.
  static absl::StatusOr<std::unique_ptr<ArenaRegion>> MapShared(const std::string& name,
                                                                uint64_t bytes);
  // Unmaps; a shared region also closes its descriptor and unlinks its name (other processes'
  // mappings stay valid until they unmap). REQUIRES: nothing registered or in use in it.
  ~ArenaRegion();
  ArenaRegion(const ArenaRegion&) = delete;
  ArenaRegion& operator=(const ArenaRegion&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  // The shared memory object's name; empty for a private region.
  const std::string& shared_memory_name() const { return name_; }

  // Asks for transparent huge pages (MADV_HUGEPAGE). Errors: AdviseHugePages's; for a shared
  // region also FAILED_PRECONDITION where its memory gets no huge pages whatever is asked: unless
  // /sys/kernel/mm/transparent_hugepage/shmem_enabled is [force], the tmpfs on /dev/shm must be
  // mounted with huge=within_size or huge=always (huge=advise yields small pages once Reserve has
  // allocated them), and the setting must not be [deny].
  // Never fatal: the region then uses small pages.
  absl::Status AdviseHugePages() const;

  // Backs [offset, offset + bytes) with memory before it is first touched: posix_fallocate on a
  // shared region; nothing on a private one (anonymous memory is the kernel's to provide). Several
  // threads may reserve disjoint ranges at once. Errors: RESOURCE_EXHAUSTED when /dev/shm cannot
  // hold them; FAILED_PRECONDITION after EndReservations.
  // REQUIRES: the range lies within the region.
  absl::Status Reserve(uint64_t offset, uint64_t bytes) ABSL_LOCKS_EXCLUDED(fd_mu_);
  // No more Reserve calls will come: a shared region closes its descriptor. Idempotent.
  void EndReservations() ABSL_LOCKS_EXCLUDED(fd_mu_);

 private:
  ArenaRegion(uint8_t* data, uint64_t size, std::string name, int fd)
      : data_(data), size_(size), name_(std::move(name)), fd_(fd) {}

  uint8_t* const data_;
  const uint64_t size_;
  const std::string name_;
  // Reserve holds it shared, so that reservations run side by side; EndReservations exclusively.
  mutable absl::Mutex fd_mu_;
  int fd_ ABSL_GUARDED_BY(fd_mu_);  // -1 when private or closed
};

}  // namespace tierd

#endif  // TIERD_STORAGE_HOST_DETAIL_ARENA_REGION_H_
