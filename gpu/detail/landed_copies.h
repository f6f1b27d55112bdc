// The copy into staging of an object whose host bytes are still being read: each part the host
// cache says has landed (HostCache::LandedCallback) is copied on at once, on the load's stream, so
// that the copy to the GPU runs beside the read instead of after it. Nothing these copies bring is
// served on their word: the object becomes readable only once the host tier answers its fetch
// with the checked bytes; then the parts not copied yet are copied, and the ready event recorded
// after them all, on the same stream (StagingLoader::CopyIn). A fetch that fails instead leaves
// staging holding bytes nobody reads, freed once the stream has run the copies.
//
// Staging is taken when the first part lands (Start), not when the fetch is asked: objects queued
// behind the reads hold none.
//
// Internal to the GPU tier. Thread-safe: started from a reader thread, told of each part on the
// loader's enqueuing thread, closed under the tier's lock. Its own lock is a leaf.
#ifndef TIERD_GPU_DETAIL_LANDED_COPIES_H_
#define TIERD_GPU_DETAIL_LANDED_COPIES_H_

#include <cstdint>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "device/device.h"
#include "gpu/chunked_copier.h"

namespace tierd {

class LandedCopies {
 public:
  // Parts copied: begin → end, disjoint, in order.
  using Parts = std::map<uint64_t, uint64_t>;

  // Copies of an object of `size` bytes from host memory of the daemon's own arena (`copier`'s
  // pieces), which must outlive this.
  LandedCopies(ChunkedCopier& copier, uint64_t size) : copier_(copier), size_(size) {}
  LandedCopies(const LandedCopies&) = delete;
  LandedCopies& operator=(const LandedCopies&) = delete;

  // Neither started nor closed: the first landing asks the tier for staging.
  bool unstarted() const ABSL_LOCKS_EXCLUDED(mu_);
  // Copies go to `staging` (the object's `size` bytes) on `stream` from now on; both must outlive
  // this. Nothing when started or closed already.
  void Start(Stream& stream, uint8_t* staging) ABSL_LOCKS_EXCLUDED(mu_);

  // A part was handed to the thread that enqueues the copies: its Landed call follows.
  void Queued() ABSL_LOCKS_EXCLUDED(mu_);
  // Enqueues the copy of [begin, end) of the object, at `bytes` in host memory, when started and
  // not closed (and ends the wait for one part Queued, if any). Never waits for the copy.
  void Landed(const uint8_t* bytes, uint64_t begin, uint64_t end) ABSL_LOCKS_EXCLUDED(mu_);
  // Until every part Queued has been through Landed: so that the answer to the object's fetch finds
  // every part told before it enqueued (those it does not are copied by whoever closes).
  void AwaitQueued() const ABSL_LOCKS_EXCLUDED(mu_);

  // Nothing is enqueued after this returns. The parts copied — none when an enqueue failed or
  // Discard was called: what was enqueued may still run, and whatever the caller enqueues next on
  // stream() runs after it.
  Parts Close() ABSL_LOCKS_EXCLUDED(mu_);
  // Closes, and the parts copied are not to be used: a fetch failed, so they may be the bytes of
  // a read that failed its check.
  void Discard() ABSL_LOCKS_EXCLUDED(mu_);

  // The stream copies go on; null before Start.
  Stream* stream() const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether any copy was enqueued: the staging range is then freed only after stream() runs it.
  bool enqueued_any() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  ChunkedCopier& copier_;
  const uint64_t size_;

  mutable absl::Mutex mu_;
  Stream* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint8_t* staging_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool discarded_ ABSL_GUARDED_BY(mu_) = false;  // Discard, or an enqueue failed
  bool enqueued_any_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t queued_ ABSL_GUARDED_BY(mu_) = 0;  // Queued, not yet through Landed
  Parts copied_ ABSL_GUARDED_BY(mu_);
};

// The parts of [0, size) that `copied` does not cover, in order.
LandedCopies::Parts PartsLeft(const LandedCopies::Parts& copied, uint64_t size);

}  // namespace tierd

#endif  // TIERD_GPU_DETAIL_LANDED_COPIES_H_
