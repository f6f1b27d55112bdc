// Pinned host memory a daemon copies objects into for peers whose GPU cannot read its own
// (FetchRequest.through_host): POSIX shared memory, registered with the daemon's device, that the
// peer maps and registers with its own (a HOST_BUFFER handle). The region is created on first use
// and its ranges are handed out first fit; a range belongs to one lease and is freed when the
// lease's drain completes. Thread-safe.
#ifndef TIERD_GPU_HOST_HANDOFF_BUFFER_H_
#define TIERD_GPU_HOST_HANDOFF_BUFFER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/free_ranges.h"
#include "device/device.h"
#include "device/shared_memory.h"

namespace tierd {

class HostHandoffBuffer {
 public:
  // The id its handle goes by in a session (Handle.id of kind HOST_BUFFER).
  static constexpr uint32_t kHandleId = 1;

  // Allocates nothing yet. `device` must outlive this.
  HostHandoffBuffer(Device& device, uint64_t bytes);
  // Unregisters and unmaps. REQUIRES: no copy into the region is in flight.
  ~HostHandoffBuffer();
  HostHandoffBuffer(const HostHandoffBuffer&) = delete;
  HostHandoffBuffer& operator=(const HostHandoffBuffer&) = delete;

  // The offset of `bytes` of the region, creating it on first use. RESOURCE_EXHAUSTED when the
  // object is larger than the region or the region is too full (its ranges come back as leases
  // drain); the errors of creating and registering the region.
  absl::StatusOr<uint64_t> Allocate(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  void Free(uint64_t offset, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  // REQUIRES: an Allocate succeeded (the region exists).
  uint8_t* data() const ABSL_LOCKS_EXCLUDED(mu_);
  // The handle a peer maps it with: the shared memory object's name.
  std::string handle() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t size() const { return bytes_; }
  // Whether the region exists (an Allocate succeeded once).
  bool allocated() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Device& device_;
  const uint64_t bytes_;
  mutable absl::Mutex mu_;
  std::unique_ptr<SharedMemory> region_ ABSL_GUARDED_BY(mu_);
  FreeRanges free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tierd

#endif  // TIERD_GPU_HOST_HANDOFF_BUFFER_H_
