// Copies of compressed host objects into staging: the compressed bytes cross the link into a
// scratch area of device memory, and the device decodes them from there into the object's staging
// range (Device::DecodeAsync).
//
// Each copy stream has a lane of its own, made on its first use: a scratch area with two slots
// for objects' tables (codec::kMaxPrefixBytes each) and two for their tiles, and a decode stream
// of high priority. The copy stream copies an object's tables, then its tiles piece by piece into
// alternate slots; the decode stream decodes each piece once it has landed. The copy stream moves
// on to the next piece, and the next object, while the last is decoded — never waiting for the
// SMs, which a model's kernels may hold — and reuses a slot only once the decode that read it is
// done. Each decode reports to a verdict word of its own, in registered host memory, read once
// the decode stream has passed it.
//
// Internal to the GPU tier. Thread-safe.
#ifndef TIERD_GPU_DETAIL_COMPRESSED_COPIES_H_
#define TIERD_GPU_DETAIL_COMPRESSED_COPIES_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "device/device.h"
#include "device/pinned_host_buffer.h"
#include "gpu/chunked_copier.h"
#include "gpu/host_source.h"

namespace tierd {

class CompressedCopies {
 public:
  // A lane's scratch area: two slots for tables, two for tiles.
  static constexpr uint64_t kTablesSlotBytes = codec::kMaxPrefixBytes;
  static constexpr uint64_t kTilesSlotBytes = 20ull << 20;
  static constexpr uint64_t kScratchBytes = 2 * kTablesSlotBytes + 2 * kTilesSlotBytes;
  // Decodes that may be in flight at once (verdict words).
  static constexpr uint32_t kVerdicts = 1024;

  // Both must outlive this.
  CompressedCopies(Device& device, ChunkedCopier& copier) : device_(device), copier_(copier) {}
  CompressedCopies(const CompressedCopies&) = delete;
  CompressedCopies& operator=(const CompressedCopies&) = delete;

  struct Enqueued {
    uint32_t verdict;  // for TakeVerdict
    Stream* done_on;   // the decode stream: the object is in staging once it has passed here
  };
  // Enqueues the copy of `host`'s compressed form (host.compressed() is set) on `stream` and its
  // decode into `dst`, host.size() bytes of device memory, on the lane's decode stream. Errors:
  // RESOURCE_EXHAUSTED when the lane cannot be made or every verdict is in use;
  // FAILED_PRECONDITION when the object's tables pass codec::kMaxPrefixBytes; the device's. On an
  // error, what was enqueued still runs, and `stream` waits for it: free `dst` after `stream`.
  // REQUIRES: `host` and `dst` stay valid until done_on has passed the decode.
  absl::StatusOr<Enqueued> Enqueue(Stream& stream, const HostBytes& host, uint8_t* dst)
      ABSL_LOCKS_EXCLUDED(mu_);
  // OK when every tile of the decode behind `verdict` matched its checksum; DATA_LOSS naming
  // `key` otherwise. Frees the verdict. REQUIRES: the decode stream has passed the decode.
  absl::Status TakeVerdict(uint32_t verdict, const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  // Makes work enqueued on `stream` after this wait for the decodes enqueued so far from it.
  absl::Status WaitForDecodes(Stream& stream) ABSL_LOCKS_EXCLUDED(mu_);
  // Frees a verdict whose outcome no longer matters. REQUIRES: its decode has completed.
  void DropVerdict(uint32_t verdict) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Lane {
    std::unique_ptr<Slab> scratch;
    std::unique_ptr<Stream> decode;
    std::unique_ptr<Event> landed;          // a piece's copy, for the decode stream to wait on
    std::unique_ptr<Event> tables_free[2];  // the last decode that read each tables slot
    std::unique_ptr<Event> tiles_free[2];   // the last decode that read each tiles slot
    int next_tables = 0;
    int next_tiles = 0;
  };

  absl::StatusOr<Lane*> LaneFor(const Stream& stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<uint32_t> AcquireVerdictLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Enqueues the copies and decodes of one object on `lane`.
  absl::Status EnqueueLocked(Lane& lane, Stream& stream, const HostBytes& host, uint8_t* dst,
                             uint32_t* verdict) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WaitForDecodesLocked(Lane& lane, Stream& stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t* VerdictWord(uint32_t verdict) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Device& device_;
  ChunkedCopier& copier_;
  absl::Mutex mu_;
  std::map<const Stream*, Lane> lanes_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<PinnedHostBuffer> verdicts_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_verdicts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tierd

#endif  // TIERD_GPU_DETAIL_COMPRESSED_COPIES_H_
