#include "storage/host_arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/free_ranges.h"
#include "common/log.h"
#include "common/posix_error.h"
#include "device/pinned_host_buffer.h"

namespace tierd {

absl::StatusOr<std::unique_ptr<HostArena>> HostArena::Create(Device& device,
                                                             const HostArenaOptions& options) {
  if (options.bytes == 0) return absl::InvalidArgumentError("host arena of 0 bytes");
  const uint64_t page = PageSize();
  const uint64_t capacity = RoundUp(options.bytes, page);
  const uint64_t piece = std::max(page, RoundUp(options.pin_piece_bytes, page));
  void* base =
      ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    return PosixError(absl::StrCat("mapping a host arena of ", FormatByteSize(capacity)), errno);
  }
  const uint64_t first = std::min(piece, capacity);
  if (absl::Status status = device.RegisterHostMemory(base, first); !status.ok()) {
    ::munmap(base, capacity);
    return absl::ResourceExhaustedError(absl::StrCat("pinning the first ", FormatByteSize(first),
                                                     " of the host arena: ", status.message()));
  }
  std::unique_ptr<HostArena> arena(
      new HostArena(device, static_cast<uint8_t*>(base), capacity, piece));
  {
    absl::MutexLock lock(&arena->mu_);
    arena->pinned_ = first;
    arena->free_.Add(0, first);
    arena->pinning_done_ = first == capacity;
  }
  if (first < capacity) {
    HostArena* self = arena.get();
    arena->pinner_ = std::thread([self] { self->PinRemainingPieces(); });
  }
  return arena;
}

HostArena::HostArena(Device& device, uint8_t* base, uint64_t capacity, uint64_t piece_bytes)
    : device_(device), base_(base), capacity_(capacity), piece_bytes_(piece_bytes) {}

HostArena::~HostArena() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (pinner_.joinable()) pinner_.join();
  uint64_t pinned;
  {
    absl::MutexLock lock(&mu_);
    pinned = pinned_;
  }
  for (uint64_t offset = 0; offset < pinned; offset += piece_bytes_) {
    if (absl::Status status = device_.UnregisterHostMemory(base_ + offset); !status.ok()) {
      TIERD_LOG(WARNING) << "unpinning host arena piece at " << offset << ": " << status;
    }
  }
  ::munmap(base_, capacity_);
}

void HostArena::PinRemainingPieces() {
  const absl::Time start = absl::Now();
  for (;;) {
    uint64_t offset;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_ || pinned_ >= capacity_) break;
      offset = pinned_;
    }
    const uint64_t size = std::min(piece_bytes_, capacity_ - offset);
    absl::Status status = device_.RegisterHostMemory(base_ + offset, size);
    absl::ReleasableMutexLock lock(&mu_);
    if (!status.ok()) {
      pin_status_ = status;
      TIERD_LOG(ERROR) << "pinning the host arena stopped at " << FormatByteSize(offset) << " of "
                       << FormatByteSize(capacity_) << ": " << status
                       << "; the host cache keeps the pinned part";
      break;
    }
    pinned_ = offset + size;
    free_.Add(offset, size);
    lock.Release();
    NotifyPinListener();
  }
  {
    absl::MutexLock lock(&mu_);
    pinning_done_ = true;
    if (pinned_ == capacity_) {
      TIERD_LOG(INFO) << "host arena fully pinned: " << FormatByteSize(capacity_) << " in "
                      << absl::FormatDuration(absl::Now() - start);
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
