// The slab, event, host buffer and host arena handles a daemon has sent one session, opened in this
// process and kept for as long as the session lives: the daemon sends each handle once per session,
// and later answers name it by id only. SessionCore's; nothing else uses it.
//
// Thread-safe.
#ifndef TIERD_WIRE_DETAIL_OPENED_HANDLES_H_
#define TIERD_WIRE_DETAIL_OPENED_HANDLES_H_

#include <cstdint>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "device/device.h"
#include "device/shared_memory.h"
#include "tierd/v1/tierd.pb.h"
#include "wire/peer_arena.h"

namespace tierd::detail {

class OpenedHandles {
 public:
  OpenedHandles() = default;
  OpenedHandles(const OpenedHandles&) = delete;
  OpenedHandles& operator=(const OpenedHandles&) = delete;

  // Opens with `device` the handles of `response` not opened yet; host buffers are also
  // registered with it (and unregistered when this goes), host arenas are mapped and registered
  // piece by piece as they are used (PeerArena). Every handle is tried: the daemon
  // counts them all as sent, so one that fails must not keep the others from being opened.
  // Returns the first failure, naming the handle.
  absl::Status Open(const v1::SessionResponse& response, const std::shared_ptr<Device>& device)
      ABSL_LOCKS_EXCLUDED(mu_);

  // An opened handle by its id; INTERNAL when the daemon named one it did not send.
  absl::StatusOr<Slab*> slab(uint32_t id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<Event*> event(uint32_t id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<const SharedMemory*> host_buffer(uint32_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // Valid while this lives.
  absl::StatusOr<PeerArena*> host_arena(uint32_t id) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct MappedHostBuffer {
    std::unique_ptr<SharedMemory> memory;
    std::shared_ptr<Device> device;  // set once registered with it
    ~MappedHostBuffer();
  };
  absl::Status OpenHostBufferLocked(const v1::Handle& handle, const std::shared_ptr<Device>& device)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::map<uint32_t, std::unique_ptr<Slab>> slabs_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, std::unique_ptr<Event>> events_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, std::unique_ptr<MappedHostBuffer>> host_buffers_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, std::unique_ptr<PeerArena>> host_arenas_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tierd::detail

#endif  // TIERD_WIRE_DETAIL_OPENED_HANDLES_H_
