// Copies of compressed host objects into staging: the compressed bytes cross the link into a
// scratch area of device memory, and the device decodes them from there into the object's staging
// range (Device::DecodeAsync), all on the copy's stream.
//
// Each stream has its own scratch area, allocated on its first use: work on one stream runs in
// order, so an object's tables go to the front of the area and its tiles follow in pieces that
// reuse the rest, each piece's copy enqueued after the previous piece's decode, with no waiting on
// the host. Each decode reports to a verdict word of its own, in registered host memory, read once
// the stream has passed it.
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
  // Device memory per stream for a compressed object's tables and tiles on their way through.
  static constexpr uint64_t kScratchBytes = 64ull << 20;
  // Decodes that may be in flight at once (verdict words).
  static constexpr uint32_t kVerdicts = 1024;

  // Both must outlive this.
  CompressedCopies(Device& device, ChunkedCopier& copier) : device_(device), copier_(copier) {}
  CompressedCopies(const CompressedCopies&) = delete;
  CompressedCopies& operator=(const CompressedCopies&) = delete;

  // Enqueues on `stream` the copy of `host`'s compressed form (host.compressed() is set) through
  // the stream's scratch area and its decode into `dst`, host.size() bytes of device memory.
  // Returns the verdict to give to TakeVerdict once the stream has passed it. Errors:
  // RESOURCE_EXHAUSTED when the scratch area cannot be allocated or every verdict is in use;
  // FAILED_PRECONDITION when the object's tables do not fit a quarter of the area; the device's.
  // On an error, what was enqueued still runs: free `dst` after the stream.
  // REQUIRES: `host` and `dst` stay valid until the stream has passed the decode.
  absl::StatusOr<uint32_t> Enqueue(Stream& stream, const HostBytes& host, uint8_t* dst)
      ABSL_LOCKS_EXCLUDED(mu_);
  // OK when every tile of the decode behind `verdict` matched its checksum; DATA_LOSS naming
  // `key` otherwise. Frees the verdict. REQUIRES: the stream has passed the decode.
  absl::Status TakeVerdict(uint32_t verdict, const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  // Frees a verdict whose decode was never enqueued, or whose outcome no longer matters.
  void DropVerdict(uint32_t verdict) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::StatusOr<uint8_t*> ScratchFor(Stream& stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<uint32_t> AcquireVerdictLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t* VerdictWord(uint32_t verdict) const;

  Device& device_;
  ChunkedCopier& copier_;
  absl::Mutex mu_;
  std::map<const Stream*, std::unique_ptr<Slab>> scratch_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<PinnedHostBuffer> verdicts_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_verdicts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tierd

#endif  // TIERD_GPU_DETAIL_COMPRESSED_COPIES_H_
