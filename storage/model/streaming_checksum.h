// The checksum of an object (ObjectChecksum) computed while its bytes land, in any order and from
// several threads, instead of in one pass once they all have: each reader thread hashes what it
// has just read while those bytes are still in its cache. The checksum is made of segments
// (object_checksum.h), each hashed on its own: the landing that completes a segment hashes it on
// its thread, so the threads reading one object hash its segments side by side — a landing hashes
// the segments it completes, at most its own bytes and a segment at each end (a reader's 4 MiB
// chunk, aligned to its file rather than to the object, may complete two). Finish waits for the
// segments being hashed and combines them once every byte has landed.
//
// Thread-safe.
#ifndef TIERD_STORAGE_MODEL_STREAMING_CHECKSUM_H_
#define TIERD_STORAGE_MODEL_STREAMING_CHECKSUM_H_

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tierd {

class StreamingChecksum {
 public:
  // `data` is the object's `size` bytes as they will be once every byte has landed; it must stay
  // valid while Landed may be called.
  StreamingChecksum(const uint8_t* data, uint64_t size);
  StreamingChecksum(const StreamingChecksum&) = delete;
  StreamingChecksum& operator=(const StreamingChecksum&) = delete;

  // Says that [begin, end) of the object now holds its final bytes, which do not change after.
  // Hashes, on the calling thread, each segment that this landing completes. Parts outside the
  // object, or landed before, are ignored.
  void Landed(uint64_t begin, uint64_t end) ABSL_LOCKS_EXCLUDED(mu_);

  // Waits for the segments being hashed and returns ObjectChecksum(data, size) when every byte
  // has landed; nullopt while some has not. Call it once the landing threads are done (a reader's
  // done callback).
  std::optional<uint64_t> Finish() ABSL_LOCKS_EXCLUDED(mu_);

  // The bytes of the segments hashed so far.
  uint64_t hashed_bytes() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return hashed_bytes_;
  }

 private:
  enum class Segment : uint8_t { kWaiting, kHashing, kHashed };

  uint64_t SegmentBegin(uint64_t segment) const;
  uint64_t SegmentEnd(uint64_t segment) const;
  // Hashes `segments` (each marked kHashing by the caller) with mu_ dropped, then marks them
  // hashed.
  void HashLocked(const std::vector<uint64_t>& segments) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint8_t* const data_;
  const uint64_t size_;
  // Each written, outside mu_, only by the thread that marked its segment kHashing; read once it
  // is kHashed.
  std::vector<uint64_t> digests_;

  mutable absl::Mutex mu_;
  // Landed ranges, begin → end, disjoint and not touching.
  std::map<uint64_t, uint64_t> landed_ ABSL_GUARDED_BY(mu_);
  std::vector<Segment> segments_ ABSL_GUARDED_BY(mu_);
  int hashing_ ABSL_GUARDED_BY(mu_) = 0;  // segments being hashed
  uint64_t hashed_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tierd

#endif  // TIERD_STORAGE_MODEL_STREAMING_CHECKSUM_H_
