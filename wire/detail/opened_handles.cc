#include "wire/detail/opened_handles.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tierd::detail {
namespace {

// The opened handle `id` in `handles`, or INTERNAL naming `what`.
template <typename T>
absl::StatusOr<T*> FindHandle(const std::map<uint32_t, std::unique_ptr<T>>& handles, uint32_t id,
                              const char* what) {
  auto it = handles.find(id);
  if (it == handles.end()) {
    return absl::InternalError(
        absl::StrCat("the daemon named ", what, " ", id, " without its handle"));
  }
  return it->second.get();
}

}  // namespace

OpenedHandles::MappedHostBuffer::~MappedHostBuffer() {
  if (device != nullptr) (void)device->UnregisterHostMemory(memory->data());
}

absl::Status OpenedHandles::Open(const v1::SessionResponse& response,
                                 const std::shared_ptr<Device>& device) {
  absl::MutexLock lock(&mu_);
  absl::Status first_failure;
  for (const v1::Handle& handle : response.new_handles()) {
    if (handle.kind() == v1::Handle::SLAB) {
      if (slabs_.count(handle.id()) > 0) continue;
      absl::StatusOr<std::unique_ptr<Slab>> slab = device->OpenSlab(handle.handle());
      if (!slab.ok()) {
        first_failure.Update(absl::Status(
            slab.status().code(),
            absl::StrCat("opening staging slab ", handle.id(), ": ", slab.status().message())));
        continue;
      }
      slabs_[handle.id()] = *std::move(slab);
    } else if (handle.kind() == v1::Handle::EVENT) {
      if (events_.count(handle.id()) > 0) continue;
      absl::StatusOr<std::unique_ptr<Event>> event = device->OpenEvent(handle.handle());
      if (!event.ok()) {
        first_failure.Update(absl::Status(
            event.status().code(),
            absl::StrCat("opening event ", handle.id(), ": ", event.status().message())));
        continue;
      }
      events_[handle.id()] = *std::move(event);
    } else if (handle.kind() == v1::Handle::HOST_BUFFER) {
      if (host_buffers_.count(handle.id()) > 0) continue;
      absl::Status opened = OpenHostBufferLocked(handle, device);
      if (!opened.ok()) {
        first_failure.Update(absl::Status(
            opened.code(),
            absl::StrCat("opening host buffer ", handle.id(), ": ", opened.message())));
      }
    } else if (handle.kind() == v1::Handle::HOST_ARENA) {
      if (host_arenas_.count(handle.id()) > 0) continue;
      absl::StatusOr<std::unique_ptr<PeerArena>> arena =
          PeerArena::Open(handle.handle(), handle.size(), handle.piece_bytes(), device);
      if (!arena.ok()) {
        first_failure.Update(absl::Status(
            arena.status().code(),
            absl::StrCat("opening host arena ", handle.id(), ": ", arena.status().message())));
        continue;
      }
      host_arenas_[handle.id()] = *std::move(arena);
    }
  }
  return first_failure;
}

absl::Status OpenedHandles::OpenHostBufferLocked(const v1::Handle& handle,
                                                 const std::shared_ptr<Device>& device) {
  ASSIGN_OR_RETURN(std::unique_ptr<SharedMemory> memory, SharedMemory::Open(handle.handle()));
  if (memory->size() < handle.size()) {
    return absl::InternalError(absl::StrCat(handle.handle(), " has ", memory->size(),
                                            " bytes, the daemon said ", handle.size()));
  }
  auto mapped = std::make_unique<MappedHostBuffer>();
  mapped->memory = std::move(memory);
  // Registered so the copies out of it run at full speed and asynchronously.
  RETURN_IF_ERROR(device->RegisterHostMemory(mapped->memory->data(), mapped->memory->size()));
  mapped->device = device;
  host_buffers_[handle.id()] = std::move(mapped);
  return absl::OkStatus();
}

absl::StatusOr<const SharedMemory*> OpenedHandles::host_buffer(uint32_t id) {
  absl::MutexLock lock(&mu_);
  auto it = host_buffers_.find(id);
  if (it == host_buffers_.end()) {
    return absl::InternalError(
        absl::StrCat("the daemon named host buffer ", id, " without its handle"));
  }
  return it->second->memory.get();
}

absl::StatusOr<PeerArena*> OpenedHandles::host_arena(uint32_t id) {
  absl::MutexLock lock(&mu_);
  return FindHandle(host_arenas_, id, "host arena");
}

absl::StatusOr<Slab*> OpenedHandles::slab(uint32_t id) {
  absl::MutexLock lock(&mu_);
  return FindHandle(slabs_, id, "slab");
}

absl::StatusOr<Event*> OpenedHandles::event(uint32_t id) {
  absl::MutexLock lock(&mu_);
  return FindHandle(events_, id, "event");
}

}  // namespace tierd::detail
