#include "gpu/detail/compressed_copies.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/status_macros.h"

namespace tierd {

absl::StatusOr<uint8_t*> CompressedCopies::ScratchFor(Stream& stream) {
  std::unique_ptr<Slab>& scratch = scratch_[&stream];
  if (scratch == nullptr) {
    absl::StatusOr<std::unique_ptr<Slab>> slab = device_.AllocateSlab(kScratchBytes);
    if (!slab.ok()) {
      scratch_.erase(&stream);
      return absl::ResourceExhaustedError(absl::StrCat("the decode scratch area (",
                                                       FormatByteSize(kScratchBytes),
                                                       "): ", slab.status().message()));
    }
    scratch = *std::move(slab);
  }
  return static_cast<uint8_t*>(scratch->data());
}

absl::StatusOr<uint32_t> CompressedCopies::AcquireVerdictLocked() {
  if (verdicts_ == nullptr) {
    ASSIGN_OR_RETURN(verdicts_, PinnedHostBuffer::Create(device_, kVerdicts * sizeof(uint32_t)));
    for (uint32_t i = kVerdicts; i > 0; --i) free_verdicts_.push_back(i - 1);
  }
  if (free_verdicts_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(kVerdicts, " decodes in flight: no verdict word is free"));
  }
  const uint32_t verdict = free_verdicts_.back();
  free_verdicts_.pop_back();
  *VerdictWord(verdict) = 0;
  return verdict;
}

uint32_t* CompressedCopies::VerdictWord(uint32_t verdict) const {
  return static_cast<uint32_t*>(verdicts_->data()) + verdict;
}

absl::StatusOr<uint32_t> CompressedCopies::Enqueue(Stream& stream, const HostBytes& host,
                                                   uint8_t* dst) {
  const codec::CompressedLayout& layout = *host.compressed();
  const uint64_t prefix = codec::CompressedPrefixBytes(layout);
  // Tiles start on a 256-byte boundary after the tables; a piece is as many as fill the rest.
  const uint64_t tiles_at = (prefix + 255) & ~uint64_t{255};
  if (tiles_at > kScratchBytes / 4) {
    return absl::FailedPreconditionError(
        absl::StrCat("the tables of a compressed object of ", FormatByteSize(layout.raw_bytes),
                     " take ", FormatByteSize(prefix), ", more than a quarter of the ",
                     FormatByteSize(kScratchBytes), " decode area"));
  }
  uint8_t* scratch;
  uint32_t verdict;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(scratch, ScratchFor(stream));
    ASSIGN_OR_RETURN(verdict, AcquireVerdictLocked());
  }
  const uint64_t tiles_per_piece = (kScratchBytes - tiles_at) / layout.tile_bytes;
  absl::Status status =
      copier_.CopyChunked(stream, scratch, host.data(), prefix, false, host.pieces());
  for (uint64_t first = 0; status.ok() && first < layout.tiles; first += tiles_per_piece) {
    const uint64_t count = std::min(tiles_per_piece, layout.tiles - first);
    status =
        copier_.CopyChunked(stream, scratch + tiles_at, codec::TileData(layout, host.data(), first),
                            count * layout.tile_bytes, false, host.pieces());
    if (status.ok()) {
      status = device_.DecodeAsync(stream, layout, scratch, scratch + tiles_at, dst, first, count,
                                   VerdictWord(verdict));
    }
  }
  if (status.ok() && layout.tiles == 0) {
    // Nothing but the tail byte (the codec keeps such objects raw; decoded all the same).
    status = device_.DecodeAsync(stream, layout, scratch, scratch + tiles_at, dst, 0, 0,
                                 VerdictWord(verdict));
  }
  if (!status.ok()) {
    // What was enqueued runs on; the verdict is not read, so it may go back once that is done.
    (void)device_.NotifyWhenDone(stream, [this, verdict] { DropVerdict(verdict); });
    return status;
  }
  return verdict;
}

absl::Status CompressedCopies::TakeVerdict(uint32_t verdict, const std::string& key) {
  absl::MutexLock lock(&mu_);
  const uint32_t word = __atomic_load_n(VerdictWord(verdict), __ATOMIC_ACQUIRE);
  free_verdicts_.push_back(verdict);
  if (word == 0) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      key, ": its compressed form in host memory does not decode to its checksums on the GPU"));
}

void CompressedCopies::DropVerdict(uint32_t verdict) {
  absl::MutexLock lock(&mu_);
  free_verdicts_.push_back(verdict);
}

}  // namespace tierd
