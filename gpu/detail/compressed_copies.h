// Copies of compressed host objects into staging: the compressed bytes cross the link into a
// scratch area of device memory, and the device decodes them from there into the object's staging
// range (Device::DecodeAsync).
//
// Each copy stream has a lane of its own, made on its first use: a scratch area split into two
// rings (scratch_ring.h), one for tables and one for tiles, and a decode stream of high priority.
// The copy stream copies an object in parts: each part's tables (its tiles' checksums, escape
// starts and escapes: codec::TileTables) into the tables ring, then its tiles into the tiles ring;
// the decode stream decodes each part once it has landed. A part is as many tiles as half the
// tiles ring holds and whose tables fit half the tables ring, so an object of any size, and any
// share of escapes, is decoded in a bounded area. The copy stream runs ahead of the decodes by as
// much as the rings hold — objects and parts keep crossing the link while a model's kernels hold
// the SMs that the decodes wait for — and waits only for a full ring. Each decode reports to a
// verdict word of its own, in registered host memory, read once the decode stream has passed it.
//
// Internal to the GPU tier. Thread-safe.
#ifndef TIERD_GPU_DETAIL_COMPRESSED_COPIES_H_
#define TIERD_GPU_DETAIL_COMPRESSED_COPIES_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "device/device.h"
#include "device/pinned_host_buffer.h"
#include "gpu/chunked_copier.h"
#include "gpu/detail/scratch_ring.h"
#include "gpu/host_source.h"

namespace tierd {

class CompressedCopies {
 public:
  // A part's tables take at most this, however large its object (about 1.3 % of a part of bf16
  // weights, 5.5 % of one of e4m3 weights quantised from a normal distribution): parts of up to
  // ~900 MiB of the one, ~220 MiB of the other. A lane's tables ring holds two parts' tables at
  // their largest; its tiles ring, the rest of the scratch area, takes parts' tiles of up to half
  // of it (at least kMinPieceBytes): an object whose tiles and tables fit is decoded by one launch.
  // Few launches matter: on a GPU shared with a model's process (without MPS) each one waits for
  // the GPU to switch to the daemon's context.
  static constexpr uint64_t kPartTablesBytes = 12ull << 20;
  static constexpr uint64_t kMinPieceBytes = 16ull << 20;
  static constexpr uint64_t kMinScratchBytes = 2 * kPartTablesBytes + 2 * kMinPieceBytes;
  // Decodes that may be in flight at once (verdict words).
  static constexpr uint32_t kVerdicts = 1024;

  // Each lane's scratch area takes `scratch_bytes` of device memory: a tables ring of twice
  // `part_tables_bytes` (a multiple of 64 KiB; bounds under the default are for tests), and a
  // tiles ring of the rest (a multiple of 1 MiB, at least twice kMinPieceBytes). The device and
  // copier must outlive this.
  CompressedCopies(Device& device, ChunkedCopier& copier, uint64_t scratch_bytes,
                   uint64_t part_tables_bytes = kPartTablesBytes)
      : device_(device),
        copier_(copier),
        scratch_bytes_(scratch_bytes),
        part_tables_bytes_(part_tables_bytes),
        piece_bytes_(std::max(kMinPieceBytes, (scratch_bytes - 2 * part_tables_bytes) / 2)) {}
  CompressedCopies(const CompressedCopies&) = delete;
  CompressedCopies& operator=(const CompressedCopies&) = delete;

  struct Enqueued {
    uint32_t verdict;  // for TakeVerdict
    Stream* done_on;   // the decode stream: the object is in staging once it has passed here
  };
  // Enqueues the copy of `host`'s compressed form (host.compressed() is set) on `stream` and its
  // decode into `dst`, host.size() bytes of device memory, on the lane's decode stream. Errors:
  // RESOURCE_EXHAUSTED when the lane cannot be made or every verdict is in use;
  // the device's. On an error, what was enqueued still runs, and `stream` waits for it: free `dst`
  // after `stream`. Escape starts in `host` that disagree with the object's are the decode's to
  // find (DATA_LOSS in its verdict), as any other corruption of the bytes is.
  // REQUIRES: `host` and `dst` stay valid until done_on has passed the decode.
  absl::StatusOr<Enqueued> Enqueue(Stream& stream, const HostBytes& host, uint8_t* dst)
      ABSL_LOCKS_EXCLUDED(mu_);
  struct Verdict {
    // OK when every tile of the decode matched its checksum; DATA_LOSS naming the object if not.
    absl::Status checked;
    // The device's time decoding the object: its decode launches, from when each could start
    // (its tiles had landed) to its end. What could not be timed (no time mark) is left out.
    absl::Duration decode_time;
  };
  // The outcome of the decode behind `verdict`, of the object `key`. Frees the verdict.
  // REQUIRES: the decode stream has passed the decode.
  Verdict TakeVerdict(uint32_t verdict, const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  // Makes work enqueued on `stream` after this wait for the decodes enqueued so far from it.
  absl::Status WaitForDecodes(Stream& stream) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Lane {
    std::unique_ptr<Slab> scratch;
    std::unique_ptr<Stream> decode;
    std::unique_ptr<Event> landed;  // a piece's copy, for the decode stream to wait on
    std::unique_ptr<ScratchRing> tables;
    std::unique_ptr<ScratchRing> tiles;
  };

  absl::StatusOr<Lane*> LaneFor(Stream& stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<uint32_t> AcquireVerdictLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Enqueues the copies and decodes of one object on `lane`.
  absl::Status EnqueueLocked(Lane& lane, Stream& stream, const HostBytes& host, uint8_t* dst,
                             uint32_t verdict) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The tiles of the part of `host`'s object from tile `first` on: at most `most`, and as many as
  // their tables fit part_tables_bytes_ (one at the least).
  uint64_t PartTiles(const HostBytes& host, uint64_t first, uint64_t most) const;
  // Enqueues the copy of tiles [first, first + count)'s tables, then the rest of the part.
  absl::Status EnqueuePartLocked(Lane& lane, Stream& stream, const HostBytes& host, uint8_t* dst,
                                 uint64_t first, uint64_t count, uint32_t verdict)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Enqueues the copy of tiles [first, first + count) and their decode with `tables`, timed.
  absl::Status EnqueueTilesLocked(Lane& lane, Stream& stream, const HostBytes& host,
                                  const codec::TileTables& tables, uint8_t* dst, uint64_t first,
                                  uint64_t count, uint32_t verdict)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Enqueues the decode of a part on `lane`'s decode stream between two time marks kept with
  // `verdict` (untimed when no mark can be made).
  absl::Status DecodeTimedLocked(Lane& lane, const codec::CompressedLayout& layout,
                                 const codec::TileTables& tables, const uint8_t* tiles, uint8_t* dst,
                                 uint64_t first, uint64_t count, uint32_t verdict)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::unique_ptr<TimeMark>> TakeTimeMarkLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives `verdict`'s time marks back, and returns the time between each pair.
  absl::Duration TakeDecodeTimeLocked(uint32_t verdict) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WaitForDecodesLocked(Lane& lane, Stream& stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t* VerdictWord(uint32_t verdict) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Device& device_;
  ChunkedCopier& copier_;
  const uint64_t scratch_bytes_;
  const uint64_t part_tables_bytes_;  // the most tables bytes one decode reads
  const uint64_t piece_bytes_;        // the most tiles bytes one decode reads
  absl::Mutex mu_;
  // Each verdict's decode launches, a start and an end mark each, until its verdict is taken; and
  // the marks free for reuse. Before lanes_: the streams that reach them go first.
  std::vector<std::vector<std::unique_ptr<TimeMark>>> time_marks_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<TimeMark>> free_time_marks_ ABSL_GUARDED_BY(mu_);
  std::map<const Stream*, Lane> lanes_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<PinnedHostBuffer> verdicts_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_verdicts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tierd

#endif  // TIERD_GPU_DETAIL_COMPRESSED_COPIES_H_
