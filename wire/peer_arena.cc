#include "wire/peer_arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "device/pinned_host_buffer.h"

namespace tierd {

absl::StatusOr<std::unique_ptr<PeerArena>> PeerArena::Open(const std::string& name, uint64_t size,
                                                           uint64_t piece_bytes,
                                                           std::shared_ptr<Device> device) {
  if (size == 0 || piece_bytes == 0 || piece_bytes % PageSize() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("host arena ", name, " of ", size,
                                                   " bytes in pieces of ", piece_bytes,
                                                   ": the pieces must be whole pages"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<SharedMemory> memory, SharedMemory::OpenReadOnly(name));
  if (memory->size() < size) {
    return absl::InternalError(
        absl::StrCat(name, " has ", memory->size(), " bytes, the daemon said ", size));
  }
  return std::unique_ptr<PeerArena>(
      new PeerArena(std::move(memory), size, piece_bytes, std::move(device)));
}

PeerArena::PeerArena(std::unique_ptr<SharedMemory> memory, uint64_t size, uint64_t piece_bytes,
                     std::shared_ptr<Device> device)
    : memory_(std::move(memory)),
      device_(std::move(device)),
      data_(static_cast<uint8_t*>(memory_->data())),
      size_(size),
      piece_bytes_(piece_bytes),
      pieces_((size + piece_bytes - 1) / piece_bytes, PieceState::kUnregistered) {}

PeerArena::~PeerArena() {
  std::thread background;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    background = std::move(background_);
  }
  // Not under the lock: the thread takes it.
  if (background.joinable()) background.join();
  absl::MutexLock lock(&mu_);
  for (uint64_t index = 0; index < pieces_.size(); ++index) {
    if (pieces_[index] != PieceState::kRegistered) continue;
    if (absl::Status status = device_->UnregisterHostMemory(data_ + index * piece_bytes_);
        !status.ok()) {
      TIERD_LOG(WARNING) << "unregistering the piece at " << index * piece_bytes_ << " of "
                         << memory_->name() << ": " << status;
    }
  }
}

bool PeerArena::PiecePresent(uint64_t index) const {
  // The first and the last page of the piece: the home faults a whole piece in before it pins it.
  const uint64_t page = PageSize();
  const uint64_t first = index * piece_bytes_;
  const uint64_t last = first + PieceSize(index) - page;
  for (const uint64_t offset : {first, last}) {
    unsigned char resident = 0;
    if (::mincore(data_ + offset, page, &resident) != 0 || (resident & 1) == 0) return false;
  }
  return true;
}

uint64_t PeerArena::PieceSize(uint64_t index) const {
  return std::min(piece_bytes_, size_ - index * piece_bytes_);
}

uint64_t PeerArena::BytesToPieceEnd(const uint8_t* p) const {
  const uint64_t offset = p - data_;
  return std::min((offset / piece_bytes_ + 1) * piece_bytes_, size_) - offset;
}

uint64_t PeerArena::registered_pieces() const {
  absl::MutexLock lock(&mu_);
  return std::count(pieces_.begin(), pieces_.end(), PieceState::kRegistered);
}

void PeerArena::RegisterAllInBackground() {
  absl::MutexLock lock(&mu_);
  if (background_.joinable()) return;
  background_ = std::thread([this] {
    const absl::Time start = absl::Now();
    const uint64_t count = (size_ + piece_bytes_ - 1) / piece_bytes_;
    // Only the pieces the home has pinned (their pages are there): registering one it has not
    // would allocate its memory, which the home reserves piece by piece and may not have room for.
    // The others are looked at again each second, until all are registered.
    for (;;) {
      uint64_t waiting = 0;
      for (uint64_t index = 0; index < count; ++index) {
        {
          absl::MutexLock lock(&mu_);
          if (stopping_) return;
          if (pieces_[index] == PieceState::kRegistered) continue;
        }
        if (!PiecePresent(index)) {
          ++waiting;
          continue;
        }
        if (absl::Status status = EnsureRegistered(index * piece_bytes_, PieceSize(index));
            !status.ok()) {
          TIERD_LOG(WARNING) << "registering the host arena " << memory_->name() << " ahead: "
                             << status << "; its pieces are registered as leases reach them";
          return;
        }
      }
      if (waiting == 0) break;
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), absl::Seconds(1))) return;
    }
    TIERD_LOG(INFO) << "host arena " << memory_->name() << " (" << (size_ >> 20)
                    << " MiB) registered in " << absl::FormatDuration(absl::Now() - start);
  });
}

absl::Status PeerArena::EnsureRegistered(uint64_t offset, uint64_t bytes) {
  if (offset > size_ || bytes > size_ - offset) {
    return absl::OutOfRangeError(absl::StrCat("bytes [", offset, ", ", offset + bytes,
                                              ") of the host arena ", memory_->name(), " of ",
                                              size_));
  }
  if (bytes == 0) return absl::OkStatus();
  const uint64_t first = offset / piece_bytes_;
  const uint64_t last = (offset + bytes - 1) / piece_bytes_;
  // Each round registers the pieces nobody else is registering, then waits for the others. A
  // round ends with a piece unregistered only when another caller failed it: the next round tries
  // it here, and returns the failure if it fails again.
  for (;;) {
    std::vector<uint64_t> mine;
    {
      absl::MutexLock lock(&mu_);
      if (!broken_.ok()) return broken_;
      for (uint64_t index = first; index <= last; ++index) {
        if (pieces_[index] != PieceState::kUnregistered) continue;
        pieces_[index] = PieceState::kRegistering;
        mine.push_back(index);
      }
    }
    absl::Status failure;
    for (uint64_t index : mine) {
      // After a failure the rest are handed back untried, for the next caller.
      if (failure.ok()) failure = RegisterPiece(index);
      absl::MutexLock lock(&mu_);
      pieces_[index] = failure.ok() ? PieceState::kRegistered : PieceState::kUnregistered;
    }
    if (!failure.ok()) return failure;
    absl::MutexLock lock(&mu_);
    auto settled = [this, first, last]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return std::none_of(pieces_.begin() + first, pieces_.begin() + last + 1,
                          [](PieceState state) { return state == PieceState::kRegistering; });
    };
    mu_.Await(absl::Condition(&settled));
    if (std::all_of(pieces_.begin() + first, pieces_.begin() + last + 1,
                    [](PieceState state) { return state == PieceState::kRegistered; })) {
      return absl::OkStatus();
    }
  }
}

absl::Status PeerArena::RegisterPiece(uint64_t index) {
  uint8_t* const data = data_ + index * piece_bytes_;
  const uint64_t bytes = PieceSize(index);
  Mode mode;
  {
    absl::MutexLock lock(&mu_);
    auto mode_known_or_free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return mode_ != Mode::kUnknown || !probing_;
    };
    mu_.Await(absl::Condition(&mode_known_or_free));
    if (!broken_.ok()) return broken_;
    mode = mode_;
    if (mode == Mode::kUnknown) probing_ = true;
  }
  switch (mode) {
    case Mode::kUnknown:
      return ProbeAndRegister(data, bytes);
    case Mode::kReadOnly:
      return device_->RegisterReadOnlyHostMemory(data, bytes);
    case Mode::kWritable:
      return device_->RegisterHostMemory(data, bytes);
  }
  return absl::InternalError("unknown registration mode");
}

absl::Status PeerArena::ProbeAndRegister(uint8_t* data, uint64_t bytes) {
  absl::Status status = device_->RegisterReadOnlyHostMemory(data, bytes);
  Mode settled = Mode::kReadOnly;
  if (absl::IsUnimplemented(status)) {
    TIERD_LOG_FIRST_N(INFO, 1) << "mapping peer host arenas read-write: " << status;
    // Nothing is registered yet, so the read-only mapping can still be replaced.
    if (absl::Status writable = memory_->MakeWritable(); !writable.ok()) {
      absl::MutexLock lock(&mu_);
      probing_ = false;
      broken_ = absl::Status(
          writable.code(), absl::StrCat("mapping the host arena read-write: ", writable.message()));
      return broken_;
    }
    settled = Mode::kWritable;
    status = device_->RegisterHostMemory(data, bytes);
  }
  absl::MutexLock lock(&mu_);
  probing_ = false;
  // A registration that failed for another reason settles nothing: the next one probes again.
  if (status.ok() || settled == Mode::kWritable) mode_ = settled;
  return status;
}

}  // namespace tierd
