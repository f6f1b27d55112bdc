#include "storage/host/host_arena.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/byte_size.h"
#include "common/free_ranges.h"
#include "common/log.h"
#include "common/machine.h"
#include "common/status_macros.h"
#include "device/pinned_host_buffer.h"
#include "device/shared_memory.h"

namespace tierd {

int DefaultPinThreads() { return std::clamp(UsableCpus() / 2, 1, 8); }

absl::StatusOr<std::unique_ptr<HostArena>> HostArena::Create(Device& device,
                                                             const HostArenaOptions& options) {
  if (options.bytes == 0) return absl::InvalidArgumentError("host arena of 0 bytes");
  const absl::Time start = absl::Now();
  const uint64_t page = PageSize();
  const uint64_t capacity = RoundUp(options.bytes, page);
  const uint64_t piece = std::max(page, RoundUp(options.pin_piece_bytes, page));
  if (options.shared) {
    // An arena left in /dev/shm by a daemon that crashed holds its memory until it is unlinked,
    // and the CUDA backend, unlike the host one, does not sweep such objects itself.
    if (int removed = RemoveStaleSharedMemory(); removed > 0) {
      TIERD_LOG(INFO) << "removed " << removed
                      << " shared memory object(s) left by tierd processes that no longer run";
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ArenaRegion> region,
                   options.shared ? ArenaRegion::MapShared(
                                        SharedMemoryPrefixForPid(::getpid()) + "arena", capacity)
                                  : ArenaRegion::MapPrivate(capacity));
  if (options.huge_pages) {
    if (absl::Status advised = region->AdviseHugePages(); !advised.ok()) {
      TIERD_LOG_FIRST_N(INFO, 1) << "host arena in small pages: " << advised;
    }
  }
  const int threads = options.pin_threads > 0 ? options.pin_threads : DefaultPinThreads();
  auto pinner = std::make_unique<ArenaPinner>(device, *region,
                                              ArenaPinnerOptions{piece, threads, options.prefault});
  absl::StatusOr<uint64_t> first = pinner->PinFirstPiece();
  if (!first.ok()) {
    pinner.reset();
    region.reset();
    return absl::ResourceExhaustedError(
        absl::StrCat("pinning the first ", FormatByteSize(std::min(piece, capacity)),
                     " of the host arena: ", first.status().message()));
  }
  std::unique_ptr<HostArena> arena(
      new HostArena(std::move(region), piece, start, std::move(pinner)));
  {
    absl::MutexLock lock(&arena->mu_);
    arena->pinned_ = *first;
    arena->free_.Add(0, *first);
    arena->pinning_done_ = *first == capacity;
  }
  if (*first == capacity) arena->region_->EndReservations();
  arena->pinner_->Start(*arena);
  return arena;
}

HostArena::HostArena(std::unique_ptr<ArenaRegion> region, uint64_t piece_bytes,
                     absl::Time pin_start, std::unique_ptr<ArenaPinner> pinner)
    : region_(std::move(region)),
      base_(region_->data()),
      capacity_(region_->size()),
      piece_bytes_(piece_bytes),
      pin_start_(pin_start),
      pinner_(std::move(pinner)) {}

HostArena::~HostArena() {
  pinner_->Stop();
  pinner_.reset();  // unregisters every piece pinned, before the memory goes
  region_.reset();
}

uint64_t HostArena::BytesToPieceEnd(const uint8_t* host) const {
  return piece_bytes_ - static_cast<uint64_t>(host - base_) % piece_bytes_;
}

void HostArena::PiecePinned(uint64_t offset, uint64_t size) {
  {
    absl::MutexLock lock(&mu_);
    pinned_ += size;
    free_.Add(offset, size);
  }
  NotifyPinListener();
}

void HostArena::PieceFailed(uint64_t offset, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (!pin_status_.ok()) return;  // the first failure is the one to report
  pin_status_ = status;
  TIERD_LOG(ERROR) << "pinning the host arena stopped at the piece at " << FormatByteSize(offset)
                   << " of " << FormatByteSize(capacity_) << ": " << status
                   << "; the host cache keeps the pinned part";
}

void HostArena::PinningEnded() {
  region_->EndReservations();  // no piece is reserved any more
  {
    absl::MutexLock lock(&mu_);
    pinning_done_ = true;
    if (pinned_ == capacity_) {
      const absl::Duration took = absl::Now() - pin_start_;
      TIERD_LOG(INFO) << "host arena fully pinned: " << FormatByteSize(capacity_) << " in "
                      << absl::FormatDuration(took) << " on " << pinner_->threads()
                      << " thread(s) ("
                      << absl::StrFormat("%.1f GiB/s",
                                         capacity_ / absl::ToDoubleSeconds(took) / (1 << 30))
                      << ")";
    } else {
      TIERD_LOG(INFO) << "host arena pinning ended: " << FormatByteSize(pinned_) << " of "
                      << FormatByteSize(capacity_) << " pinned";
    }
  }
  NotifyPinListener();
}

void HostArena::NotifyPinListener() {
  absl::MutexLock lock(&listener_mu_);
  if (listener_) listener_();
}

void HostArena::SetPinListener(std::function<void()> listener) {
  absl::MutexLock lock(&listener_mu_);
  listener_ = std::move(listener);
}

bool HostArena::pinning() const {
  absl::MutexLock lock(&mu_);
  return !pinning_done_;
}

std::optional<ArenaAllocation> HostArena::Allocate(uint64_t bytes) {
  // An empty object takes no room: an empty allocation, which frees nothing.
  if (bytes == 0) return ArenaAllocation(this, 0, 0);
  if (bytes > capacity()) return std::nullopt;  // also keeps RoundUp from overflowing
  const uint64_t size = RoundUp(bytes, PageSize());
  absl::MutexLock lock(&mu_);
  const std::optional<uint64_t> offset = free_.Take(size);
  if (!offset) return std::nullopt;
  used_ += size;
  return ArenaAllocation(this, *offset, size);
}

void HostArena::Free(uint64_t offset, uint64_t size) {
  absl::MutexLock lock(&mu_);
  used_ -= size;
  free_.Add(offset, size);
}

ArenaAllocation& ArenaAllocation::operator=(ArenaAllocation&& other) noexcept {
  if (this != &other) {
    reset();
    arena_ = std::exchange(other.arena_, nullptr);
    offset_ = std::exchange(other.offset_, 0);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void ArenaAllocation::reset() {
  if (arena_ != nullptr && size_ > 0) arena_->Free(offset_, size_);
  arena_ = nullptr;
  offset_ = 0;
  size_ = 0;
}

uint64_t HostArena::pinned_bytes() const {
  absl::MutexLock lock(&mu_);
  return pinned_;
}

uint64_t HostArena::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

uint64_t HostArena::largest_free_block() const {
  absl::MutexLock lock(&mu_);
  return free_.largest();
}

absl::Status HostArena::pin_status() const {
  absl::MutexLock lock(&mu_);
  return pin_status_;
}

bool HostArena::WaitUntilFullyPinned(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&pinning_done_), timeout);
  return pinned_ == capacity_;
}

}  // namespace tierd
