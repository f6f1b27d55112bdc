#include "storage/host/detail/arena_pinner.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace tierd {

ArenaPinner::ArenaPinner(Device& device, ArenaRegion& region, const ArenaPinnerOptions& options)
    : device_(device),
      region_(region),
      base_(region.data()),
      capacity_(region.size()),
      options_(options),
      piece_count_((capacity_ + options.piece_bytes - 1) / options.piece_bytes),
      threads_(static_cast<int>(
          std::clamp<uint64_t>(piece_count_ - 1, 1, std::max(options.threads, 1)))),
      registered_(piece_count_, false) {}

ArenaPinner::~ArenaPinner() {
  Stop();
  absl::MutexLock lock(&mu_);
  for (uint64_t index = 0; index < piece_count_; ++index) {
    if (!registered_[index]) continue;
    if (absl::Status status = device_.UnregisterHostMemory(base_ + PieceOffset(index));
        !status.ok()) {
      TIERD_LOG(WARNING) << "unpinning host arena piece at " << PieceOffset(index) << ": "
                         << status;
    }
  }
}

uint64_t ArenaPinner::PieceSize(uint64_t index) const {
  return std::min(options_.piece_bytes, capacity_ - PieceOffset(index));
}

absl::StatusOr<uint64_t> ArenaPinner::PinFirstPiece() {
  {
    absl::MutexLock lock(&mu_);
    next_piece_ = 1;
  }
  bool skipped = false;
  RETURN_IF_ERROR(PinPiece(0, &skipped));
  return PieceSize(0);
}

void ArenaPinner::Start(PinObserver& observer) {
  absl::MutexLock workers_lock(&workers_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (next_piece_ >= piece_count_) return;
    running_ = threads_;
  }
  workers_.reserve(threads_);
  for (int i = 0; i < threads_; ++i) {
    workers_.emplace_back([this, &observer] { PinPieces(observer); });
  }
}

void ArenaPinner::Stop() {
  absl::MutexLock workers_lock(&workers_mu_);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
  workers_.clear();
}

void ArenaPinner::PinPieces(PinObserver& observer) {
  for (;;) {
    uint64_t index;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_ || failed_ || next_piece_ >= piece_count_) break;
      index = next_piece_++;
    }
    bool skipped = false;
    absl::Status status = PinPiece(index, &skipped);
    if (skipped) break;
    if (status.ok()) {
      observer.PiecePinned(PieceOffset(index), PieceSize(index));
    } else {
      {
        absl::MutexLock lock(&mu_);
        failed_ = true;
      }
      observer.PieceFailed(PieceOffset(index), status);
    }
  }
  bool last;
  {
    absl::MutexLock lock(&mu_);
    last = --running_ == 0;
  }
  if (last) observer.PinningEnded();
}

absl::Status ArenaPinner::PinPiece(uint64_t index, bool* skipped) {
  uint8_t* const data = base_ + PieceOffset(index);
  const uint64_t size = PieceSize(index);
  // Before anything touches it: a shared region out of memory fails here, not with SIGBUS.
  RETURN_IF_ERROR(region_.Reserve(PieceOffset(index), size));
  RETURN_IF_ERROR(PrefaultPages(data, size, options_.prefault));
  {
    // Faulting a piece in takes a while; a pinner told to stop meanwhile registers nothing more.
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      *skipped = true;
      return absl::OkStatus();
    }
  }
  RETURN_IF_ERROR(device_.RegisterHostMemory(data, size));
  absl::MutexLock lock(&mu_);
  registered_[index] = true;
  return absl::OkStatus();
}

}  // namespace tierd
