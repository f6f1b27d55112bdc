// The checksum of an object (ObjectChecksum) computed while its bytes land, in any order and from
// several threads, instead of in one pass once they all have: each reader thread hashes what it
// has just read while those bytes are still in its cache. xxHash3 is sequential, so a range is
// hashed only once every byte before it has been: a range that lands ahead of that waits, and the
// thread whose landing closes the gap hashes it too — up to kBytesHashedPerByteTold times what it
// told, so that a reader thread is never held long from its reads; what is left waits for the next
// landing or for Finish. One thread hashes at a time; the others record their range and return.
//
// Thread-safe.
#ifndef TIERD_STORAGE_MODEL_STREAMING_CHECKSUM_H_
#define TIERD_STORAGE_MODEL_STREAMING_CHECKSUM_H_

#include <xxhash.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>

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

  // A landing hashes at most this many bytes per byte it tells.
  static constexpr uint64_t kBytesHashedPerByteTold = 2;

  // Says that [begin, end) of the object now holds its final bytes, which do not change after.
  // Hashes, on the calling thread, what the hashed prefix can now be extended by, within its
  // budget — unless another thread is hashing, which then finds it. Parts outside the object, or
  // landed before, are ignored.
  void Landed(uint64_t begin, uint64_t end) ABSL_LOCKS_EXCLUDED(mu_);

  // Hashes what has landed and is not hashed yet, on the calling thread, and returns
  // ObjectChecksum(data, size) when every byte has landed; nullopt while some has not. Call it once
  // the landing threads are done (a reader's done callback); it waits for a hashing thread.
  std::optional<uint64_t> Finish() ABSL_LOCKS_EXCLUDED(mu_);

  // The bytes hashed so far: a prefix of the object.
  uint64_t hashed_bytes() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return hashed_;
  }

 private:
  // Hashes the waiting ranges that extend the prefix, up to `budget` bytes, dropping mu_ while it
  // hashes. REQUIRES: no other thread is hashing.
  void HashWaitingLocked(uint64_t budget) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct StateDeleter {
    void operator()(XXH3_state_t* state) const { XXH3_freeState(state); }
  };

  const uint8_t* const data_;
  const uint64_t size_;
  // Written only by the thread that set hashing_, outside mu_.
  const std::unique_ptr<XXH3_state_t, StateDeleter> state_;

  mutable absl::Mutex mu_;
  uint64_t hashed_ ABSL_GUARDED_BY(mu_) = 0;  // [0, hashed_) is in state_
  // Landed ranges beyond hashed_, begin → end, disjoint and not touching.
  std::map<uint64_t, uint64_t> waiting_ ABSL_GUARDED_BY(mu_);
  bool hashing_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tierd

#endif  // TIERD_STORAGE_MODEL_STREAMING_CHECKSUM_H_
