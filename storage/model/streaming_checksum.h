// The checksum of an object (ObjectChecksum) computed while its bytes land, in any order and from
// several threads, instead of in one pass once they all have: each reader thread hashes what it
// has just read while those bytes are still in its cache. The checksum is made of segments
// (object_checksum.h), each hashed in order into a state of its own: a landing that reaches a
// segment's hashed prefix hashes its bytes into it at once, on its thread — a reader telling a
// segment's bytes piece by piece as it reads them (a memory-backed file's, in 256 KiB pieces)
// hashes each while it is in the core's cache — then whatever had landed after them. Bytes that
// land ahead of that prefix wait for the landing that reaches them. So the threads reading one
// object hash its segments side by side, and a segment is never hashed by two threads at once: one
// that lands bytes of a segment being hashed leaves them to the thread hashing it, which takes them
// before it lets go. Finish waits for the hashing and combines the segments once every byte has
// landed.
//
// Whoever wants the bytes while they land (the GPU tier copying an object on as it is read) can be
// told of each segment once it is hashed through: its bytes are then all there and final.
//
// Thread-safe.
#ifndef TIERD_STORAGE_MODEL_STREAMING_CHECKSUM_H_
#define TIERD_STORAGE_MODEL_STREAMING_CHECKSUM_H_

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "storage/model/object_checksum.h"

namespace tierd {

class StreamingChecksum {
 public:
  // Told [begin, end) of a segment whose every byte has landed and been hashed: on the thread that
  // hashed its last bytes, once per segment, before Finish returns. Must not block.
  using SegmentHashed = absl::AnyInvocable<void(uint64_t begin, uint64_t end) const>;

  // `data` is the object's `size` bytes as they will be once every byte has landed; it must stay
  // valid while Landed may be called. `segment_hashed` may be null.
  StreamingChecksum(const uint8_t* data, uint64_t size, SegmentHashed segment_hashed = nullptr);
  StreamingChecksum(const StreamingChecksum&) = delete;
  StreamingChecksum& operator=(const StreamingChecksum&) = delete;

  // Says that [begin, end) of the object now holds its final bytes, which do not change after.
  // Hashes, on the calling thread, what it lets be hashed in order in the segments it touches (its
  // bytes and those landed after them), but for a segment another thread is hashing, which takes
  // them. Parts outside the object, or landed before, are ignored.
  void Landed(uint64_t begin, uint64_t end) ABSL_LOCKS_EXCLUDED(mu_);

  // Waits for the segments being hashed and returns ObjectChecksum(data, size) when every byte
  // has landed; nullopt while some has not. Call it once the landing threads are done (a reader's
  // done callback).
  std::optional<uint64_t> Finish() ABSL_LOCKS_EXCLUDED(mu_);

  // The bytes hashed so far.
  uint64_t hashed_bytes() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return hashed_bytes_;
  }

 private:
  struct Segment {
    uint64_t hashed = 0;   // bytes from its start hashed so far, in order
    bool hashing = false;  // a thread is hashing more of it, outside mu_
    // Its xxHash3 state while it is partly hashed (one hashed in a single landing needs none).
    Xxh3State state;
  };

  uint64_t SegmentBegin(uint64_t segment) const;
  uint64_t SegmentEnd(uint64_t segment) const;
  // Hashes into `segment` whatever has landed in order after its hashed prefix, unless another
  // thread is hashing it; drops mu_ while hashing.
  void HashLocked(uint64_t segment) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint8_t* const data_;
  const uint64_t size_;
  const SegmentHashed segment_hashed_;
  // Each written, outside mu_, only by the thread hashing its segment; read once every segment is
  // hashed.
  std::vector<uint64_t> digests_;

  mutable absl::Mutex mu_;
  // Landed ranges, begin → end, disjoint and not touching.
  std::map<uint64_t, uint64_t> landed_ ABSL_GUARDED_BY(mu_);
  // A segment's state and `hashed` belong to the thread that set its `hashing` while it is set.
  std::vector<Segment> segments_ ABSL_GUARDED_BY(mu_);
  int hashing_ ABSL_GUARDED_BY(mu_) = 0;  // segments being hashed
  uint64_t hashed_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tierd

#endif  // TIERD_STORAGE_MODEL_STREAMING_CHECKSUM_H_
