#include "gpu/detail/compressed_copies.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "codec/exponent_codec.h"
#include "common/byte_size.h"
#include "common/status_macros.h"

namespace tierd {
namespace {

// Where ranges of the two rings start: tables are small (most under 1 MiB), pieces of tiles
// mostly whole pieces.
constexpr uint64_t kTablesGranule = 64 << 10;
constexpr uint64_t kTilesGranule = 1 << 20;

}  // namespace

absl::StatusOr<CompressedCopies::Lane*> CompressedCopies::LaneFor(Stream& stream) {
  if (auto it = lanes_.find(&stream); it != lanes_.end()) return &it->second;
  Lane lane;
  absl::StatusOr<std::unique_ptr<Slab>> scratch = device_.AllocateSlab(scratch_bytes_);
  if (!scratch.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("the decode scratch area (",
                                                     FormatByteSize(scratch_bytes_),
                                                     "): ", scratch.status().message()));
  }
  lane.scratch = *std::move(scratch);
  // High priority: a decode's blocks go before a model's pending ones as SMs come free.
  ASSIGN_OR_RETURN(lane.decode, device_.CreateStream(StreamPriority::kHigh));
  ASSIGN_OR_RETURN(lane.landed, device_.CreateEvent());
  auto* scratch_base = static_cast<uint8_t*>(lane.scratch->data());
  const uint64_t tables_ring_bytes = 2 * part_tables_bytes_;
  lane.tables = std::make_unique<ScratchRing>(device_, stream, *lane.decode, scratch_base,
                                              tables_ring_bytes, kTablesGranule);
  lane.tiles =
      std::make_unique<ScratchRing>(device_, stream, *lane.decode, scratch_base + tables_ring_bytes,
                                    scratch_bytes_ - tables_ring_bytes, kTilesGranule);
  return &lanes_.emplace(&stream, std::move(lane)).first->second;
}

absl::StatusOr<uint32_t> CompressedCopies::AcquireVerdictLocked() {
  if (verdicts_ == nullptr) {
    ASSIGN_OR_RETURN(verdicts_, PinnedHostBuffer::Create(device_, kVerdicts * sizeof(uint32_t)));
    for (uint32_t i = kVerdicts; i > 0; --i) free_verdicts_.push_back(i - 1);
    time_marks_.resize(kVerdicts);
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
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Lane * lane, LaneFor(stream));
  ASSIGN_OR_RETURN(const uint32_t verdict, AcquireVerdictLocked());
  const absl::Status status = EnqueueLocked(*lane, stream, host, dst, verdict);
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
                                             uint8_t* dst, uint32_t verdict) {
  const codec::CompressedLayout& layout = *host.compressed();
  const uint64_t tiles_per_piece = piece_bytes_ / layout.tile_bytes;
  uint64_t first = 0;
  do {
    // A part (none of the tiles when the object is all tail), then its decode.
    const uint64_t count = PartTiles(host, first, std::min(tiles_per_piece, layout.tiles - first));
    RETURN_IF_ERROR(EnqueuePartLocked(lane, stream, host, dst, first, count, verdict));
    first += count;
  } while (first < layout.tiles);
  return absl::OkStatus();
}

uint64_t CompressedCopies::PartTiles(const HostBytes& host, uint64_t first, uint64_t most) const {
  const codec::CompressedLayout& layout = *host.compressed();
  const auto fits = [&](uint64_t count) {
    const uint64_t escapes = codec::EscapesOfTiles(layout, host.data(), first, count).count;
    return codec::CopiedTablesBytes(count, escapes) <= part_tables_bytes_;
  };
  if (most == 0 || fits(most)) return most;
  // fits(low) and not fits(high); a tile's tables (at most a tile's words of escapes) always fit.
  uint64_t low = 1;
  uint64_t high = most;
  while (high - low > 1) {
    const uint64_t middle = low + (high - low) / 2;
    (fits(middle) ? low : high) = middle;
  }
  return low;
}

absl::Status CompressedCopies::EnqueuePartLocked(Lane& lane, Stream& stream, const HostBytes& host,
                                                 uint8_t* dst, uint64_t first, uint64_t count,
                                                 uint32_t verdict) {
  const codec::CompressedLayout& layout = *host.compressed();
  const codec::EscapeRange escapes = codec::EscapesOfTiles(layout, host.data(), first, count);
  const uint64_t checksums_bytes = codec::AlignUp16(4 * count);
  const uint64_t starts_bytes = codec::AlignUp16(4 * (count + 1));
  ASSIGN_OR_RETURN(uint8_t* const tables,
                   lane.tables->Take(codec::CopiedTablesBytes(count, escapes.count)));
  const codec::TileTables part{reinterpret_cast<const uint32_t*>(tables),
                               reinterpret_cast<const uint32_t*>(tables + checksums_bytes),
                               tables + checksums_bytes + starts_bytes, escapes.base,
                               escapes.count};
  absl::Status status;
  const auto copy = [&](uint8_t* to, uint64_t from, uint64_t bytes) {
    if (status.ok() && bytes > 0) {
      status = copier_.CopyChunked(stream, to, host.data() + from, bytes, false, host.pieces());
    }
  };
  if (first == 0 && count == layout.tiles && escapes.base == 0 &&
      escapes.count == layout.escapes) {
    // The whole object's: the format lays them out after its header as a part's are copied.
    copy(tables, layout.checksums_offset, layout.data_offset - layout.checksums_offset);
  } else {
    copy(tables, layout.checksums_offset + 4 * first, 4 * count);
    copy(tables + checksums_bytes, layout.escape_starts_offset + 4 * first, 4 * (count + 1));
    copy(tables + checksums_bytes + starts_bytes, layout.escapes_offset + escapes.base,
         escapes.count);
  }
  if (status.ok()) status = EnqueueTilesLocked(lane, stream, host, part, dst, first, count, verdict);
  // The tables are read until the part's decode; given back even after an error, so that the ring
  // knows when they are free.
  const absl::Status given_back = lane.tables->GiveBack();
  return status.ok() ? given_back : status;
}

absl::Status CompressedCopies::EnqueueTilesLocked(Lane& lane, Stream& stream,
                                                  const HostBytes& host,
                                                  const codec::TileTables& tables, uint8_t* dst,
                                                  uint64_t first, uint64_t count,
                                                  uint32_t verdict) {
  const codec::CompressedLayout& layout = *host.compressed();
  const uint8_t* tiles = reinterpret_cast<const uint8_t*>(tables.checksums);  // when there are none
  absl::Status status;
  if (count > 0) {
    ASSIGN_OR_RETURN(uint8_t* const piece, lane.tiles->Take(count * layout.tile_bytes));
    status = copier_.CopyChunked(stream, piece, codec::TileData(layout, host.data(), first),
                                 count * layout.tile_bytes, false, host.pieces());
    tiles = piece;
  }
  if (status.ok()) status = device_.RecordEvent(*lane.landed, stream);
  if (status.ok()) status = device_.WaitEvent(*lane.decode, *lane.landed);
  if (status.ok())
    status = DecodeTimedLocked(lane, layout, tables, tiles, dst, first, count, verdict);
  if (count == 0) return status;
  const absl::Status given_back = lane.tiles->GiveBack();
  return status.ok() ? given_back : status;
}

absl::Status CompressedCopies::DecodeTimedLocked(Lane& lane, const codec::CompressedLayout& layout,
                                                 const codec::TileTables& tables,
                                                 const uint8_t* tiles,
                                                 uint8_t* dst, uint64_t first, uint64_t count,
                                                 uint32_t verdict) {
  uint32_t* const word = VerdictWord(verdict);
  absl::StatusOr<std::unique_ptr<TimeMark>> start = TakeTimeMarkLocked();
  absl::StatusOr<std::unique_ptr<TimeMark>> end = TakeTimeMarkLocked();
  if (!start.ok() || !end.ok()) {
    if (start.ok()) free_time_marks_.push_back(*std::move(start));
    if (end.ok()) free_time_marks_.push_back(*std::move(end));
    return device_.DecodeAsync(*lane.decode, layout, tables, tiles, dst, first, count, word);
  }
  // The marks stay with the verdict once recorded, even after an error: a verdict given up on is
  // never reused, so neither are marks its stream may still reach.
  std::vector<std::unique_ptr<TimeMark>>& marks = time_marks_[verdict];
  RETURN_IF_ERROR(device_.RecordTimeMark(**start, *lane.decode));
  marks.push_back(*std::move(start));
  RETURN_IF_ERROR(
      device_.DecodeAsync(*lane.decode, layout, tables, tiles, dst, first, count, word));
  RETURN_IF_ERROR(device_.RecordTimeMark(**end, *lane.decode));
  marks.push_back(*std::move(end));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TimeMark>> CompressedCopies::TakeTimeMarkLocked() {
  if (free_time_marks_.empty()) return device_.CreateTimeMark();
  std::unique_ptr<TimeMark> mark = std::move(free_time_marks_.back());
  free_time_marks_.pop_back();
  return mark;
}

absl::Duration CompressedCopies::TakeDecodeTimeLocked(uint32_t verdict) {
  std::vector<std::unique_ptr<TimeMark>>& marks = time_marks_[verdict];
  absl::Duration total;
  for (size_t i = 0; i + 1 < marks.size(); i += 2) {
    if (absl::StatusOr<absl::Duration> took = device_.TimeBetween(*marks[i], *marks[i + 1]);
        took.ok()) {
      total += *took;
    }
  }
  for (std::unique_ptr<TimeMark>& mark : marks) free_time_marks_.push_back(std::move(mark));
  marks.clear();
  return total;
}

CompressedCopies::Verdict CompressedCopies::TakeVerdict(uint32_t verdict, const std::string& key) {
  absl::MutexLock lock(&mu_);
  const uint32_t word = __atomic_load_n(VerdictWord(verdict), __ATOMIC_ACQUIRE);
  Verdict outcome{absl::OkStatus(), TakeDecodeTimeLocked(verdict)};
  free_verdicts_.push_back(verdict);
  if (word != 0) {
    outcome.checked = absl::DataLossError(absl::StrCat(
        key, ": its compressed form in host memory does not decode to its checksums on the GPU"));
  }
  return outcome;
}

}  // namespace tierd
