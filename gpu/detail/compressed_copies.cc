#include "gpu/detail/compressed_copies.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/status_macros.h"

namespace tierd {

absl::StatusOr<CompressedCopies::Lane*> CompressedCopies::LaneFor(const Stream& stream) {
  if (auto it = lanes_.find(&stream); it != lanes_.end()) return &it->second;
  Lane lane;
  absl::StatusOr<std::unique_ptr<Slab>> scratch = device_.AllocateSlab(kScratchBytes);
  if (!scratch.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("the decode scratch area (",
                                                     FormatByteSize(kScratchBytes),
                                                     "): ", scratch.status().message()));
  }
  lane.scratch = *std::move(scratch);
  // High priority: a decode's blocks go before a model's pending ones as SMs come free.
  ASSIGN_OR_RETURN(lane.decode, device_.CreateStream(StreamPriority::kHigh));
  ASSIGN_OR_RETURN(lane.landed, device_.CreateEvent());
  for (int slot = 0; slot < 2; ++slot) {
    ASSIGN_OR_RETURN(lane.tables_free[slot], device_.CreateEvent());
    ASSIGN_OR_RETURN(lane.tiles_free[slot], device_.CreateEvent());
  }
  return &lanes_.emplace(&stream, std::move(lane)).first->second;
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

absl::StatusOr<CompressedCopies::Enqueued> CompressedCopies::Enqueue(Stream& stream,
                                                                     const HostBytes& host,
                                                                     uint8_t* dst) {
  const codec::CompressedLayout& layout = *host.compressed();
  if (codec::CompressedPrefixBytes(layout) > kTablesSlotBytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("the tables of a compressed object of ", FormatByteSize(layout.raw_bytes),
                     " take ", FormatByteSize(codec::CompressedPrefixBytes(layout)),
                     ", more than the ", FormatByteSize(kTablesSlotBytes), " a decode keeps"));
  }
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Lane * lane, LaneFor(stream));
  ASSIGN_OR_RETURN(const uint32_t verdict, AcquireVerdictLocked());
  const absl::Status status = EnqueueLocked(*lane, stream, host, dst, VerdictWord(verdict));
  if (!status.ok()) {
    // What was enqueued runs on; `stream` waits for the decodes too, so that freeing `dst` after
    // it is safe. The verdict is not given back: a decode may still write it.
    (void)WaitForDecodesLocked(*lane, stream);
    return status;
  }
  return Enqueued{verdict, lane->decode.get()};
}

absl::Status CompressedCopies::WaitForDecodes(Stream& stream) {
  absl::MutexLock lock(&mu_);
  auto it = lanes_.find(&stream);
  if (it == lanes_.end()) return absl::OkStatus();
  return WaitForDecodesLocked(it->second, stream);
}

absl::Status CompressedCopies::WaitForDecodesLocked(Lane& lane, Stream& stream) {
  RETURN_IF_ERROR(device_.RecordEvent(*lane.landed, *lane.decode));
  return device_.WaitEvent(stream, *lane.landed);
}

absl::Status CompressedCopies::EnqueueLocked(Lane& lane, Stream& stream, const HostBytes& host,
                                             uint8_t* dst, uint32_t* verdict) {
  const codec::CompressedLayout& layout = *host.compressed();
  auto* scratch = static_cast<uint8_t*>(lane.scratch->data());
  const int tables_slot = lane.next_tables;
  lane.next_tables ^= 1;
  uint8_t* tables = scratch + tables_slot * kTablesSlotBytes;
  RETURN_IF_ERROR(device_.WaitEvent(stream, *lane.tables_free[tables_slot]));
  RETURN_IF_ERROR(copier_.CopyChunked(stream, tables, host.data(),
                                      codec::CompressedPrefixBytes(layout), false, host.pieces()));
  const uint64_t tiles_per_piece = kTilesSlotBytes / layout.tile_bytes;
  uint64_t first = 0;
  do {
    // A piece of tiles (none when the object is all tail) into the next tiles slot.
    const uint64_t count = std::min(tiles_per_piece, layout.tiles - first);
    const int tiles_slot = lane.next_tiles;
    lane.next_tiles ^= 1;
    uint8_t* tiles = scratch + 2 * kTablesSlotBytes + tiles_slot * kTilesSlotBytes;
    RETURN_IF_ERROR(device_.WaitEvent(stream, *lane.tiles_free[tiles_slot]));
    if (count > 0) {
      RETURN_IF_ERROR(copier_.CopyChunked(stream, tiles,
                                          codec::TileData(layout, host.data(), first),
                                          count * layout.tile_bytes, false, host.pieces()));
    }
    RETURN_IF_ERROR(device_.RecordEvent(*lane.landed, stream));
    RETURN_IF_ERROR(device_.WaitEvent(*lane.decode, *lane.landed));
    RETURN_IF_ERROR(
        device_.DecodeAsync(*lane.decode, layout, tables, tiles, dst, first, count, verdict));
    RETURN_IF_ERROR(device_.RecordEvent(*lane.tiles_free[tiles_slot], *lane.decode));
    first += count;
  } while (first < layout.tiles);
  return device_.RecordEvent(*lane.tables_free[tables_slot], *lane.decode);
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
