#include "client/session_core.h"

#include <cstdio>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/status_macros.h"

namespace tierd {

struct SessionCore::Pending {
  absl::Notification done;
  absl::StatusOr<v1::SessionResponse> response;
  std::function<void(const v1::SessionResponse&)> callback;  // asynchronous requests
};

namespace {

constexpr absl::string_view kEnded = "the session with tierd has ended";
// How long a caller whose write failed waits for the reader to learn why the stream ended: at
// once, unless the machine is very busy.
constexpr absl::Duration kEndReasonWait = absl::Seconds(2);

// The session whose reader runs on this thread, if any: its callbacks may send, and must not wait
// for their own reader.
thread_local const SessionCore* reading_session = nullptr;

// The answer a request gets when the session ends before the daemon's does: `ended`.
v1::SessionResponse EndedResponse(uint64_t request_id, const absl::Status& ended) {
  v1::SessionResponse gone;
  gone.set_request_id(request_id);
  gone.set_code(static_cast<int>(ended.code()));
  gone.set_message(std::string(ended.message()));
  return gone;
}

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

void LogFailure(const v1::SessionResponse& response) {
  std::fprintf(stderr, "tierd client: request %llu failed: %s\n",
               static_cast<unsigned long long>(response.request_id()), response.message().c_str());
}

}  // namespace

absl::Status StatusOf(const v1::SessionResponse& response) {
  if (response.code() == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(response.code()), response.message());
}

std::shared_ptr<SessionCore> SessionCore::Start(std::unique_ptr<SessionTransport> transport) {
  std::shared_ptr<SessionCore> core(new SessionCore);
  core->transport_ = std::move(transport);
  core->reader_ = std::thread([raw = core.get()] { raw->ReadLoop(); });
  return core;
}

SessionCore::~SessionCore() {
  {
    absl::MutexLock lock(&write_mu_);
    transport_->CloseWrites();
  }
  reader_.join();
  transport_.reset();
}

void SessionCore::ReadLoop() {
  reading_session = this;
  v1::SessionResponse response;
  while (transport_->Read(response)) {
    std::shared_ptr<Pending> pending;
    {
      absl::MutexLock lock(&mu_);
      auto it = pending_.find(response.request_id());
      if (it == pending_.end()) {
        // A quiet request's failure (nobody waits for it), or an answer nobody asked for.
        if (response.code() != 0) LogFailure(response);
        continue;
      }
      pending = std::move(it->second);
      pending_.erase(it);
    }
    // Handles are opened here, in response order, so a later response that names one finds it.
    if (response.new_handles_size() > 0) {
      if (absl::Status opened = OpenHandles(response); !opened.ok()) {
        response.set_code(static_cast<int>(opened.code()));
        response.set_message(std::string(opened.message()));
      }
    }
    if (pending->callback) {
      pending->callback(response);
      continue;
    }
    pending->response = std::move(response);
    pending->done.Notify();
    response = v1::SessionResponse();
  }
  absl::Status reason;
  {
    // gRPC lets a Read run beside a Write, but not Finish.
    absl::MutexLock lock(&write_mu_);
    reason = transport_->Finish();
  }
  std::map<uint64_t, std::shared_ptr<Pending>> orphans;
  absl::Status ended;
  {
    absl::MutexLock lock(&mu_);
    ended_ = true;
    end_reason_ = reason;
    ended = EndedLocked();
    orphans.swap(pending_);
  }
  for (auto& [id, pending] : orphans) {
    if (pending->callback) {
      pending->callback(EndedResponse(id, ended));
      continue;
    }
    pending->response = ended;
    pending->done.Notify();
  }
}

absl::Status SessionCore::EndedLocked() const {
  if (end_reason_.ok()) return absl::UnavailableError(kEnded);
  return absl::UnavailableError(absl::StrCat(kEnded, ": ", end_reason_.message()));
}

absl::Status SessionCore::EndedAfterFailedWrite() {
  absl::MutexLock lock(&mu_);
  if (reading_session != this) mu_.AwaitWithTimeout(absl::Condition(&ended_), kEndReasonWait);
  return EndedLocked();
}

absl::Status SessionCore::end_reason() {
  absl::MutexLock lock(&mu_);
  return end_reason_;
}

bool SessionCore::ended() {
  absl::MutexLock lock(&mu_);
  return ended_;
}

absl::StatusOr<v1::SessionResponse> SessionCore::Call(v1::SessionRequest request) {
  auto pending = std::make_shared<Pending>();
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return EndedLocked();
    request.set_request_id(next_request_++);
    pending_[request.request_id()] = pending;
  }
  bool written;
  {
    absl::MutexLock lock(&write_mu_);
    written = transport_->Write(request);
  }
  if (!written) {
    bool still_ours;
    {
      absl::MutexLock state(&mu_);
      still_ours = pending_.erase(request.request_id()) > 0;
    }
    // Unless the reader already answered it as an orphan (with the reason), say why here.
    if (still_ours) return EndedAfterFailedWrite();
  }
  pending->done.WaitForNotification();
  if (!pending->response.ok()) return pending->response.status();
  if (absl::Status status = StatusOf(*pending->response); !status.ok()) return status;
  return std::move(pending->response);
}

absl::Status SessionCore::Send(v1::SessionRequest request,
                               std::function<void(const v1::SessionResponse&)> done) {
  auto pending = std::make_shared<Pending>();
  pending->callback = done ? std::move(done) : [](const v1::SessionResponse& response) {
    if (response.code() != 0) LogFailure(response);
  };
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return EndedLocked();
    request.set_request_id(next_request_++);
    pending_[request.request_id()] = pending;
  }
  bool written;
  {
    absl::MutexLock lock(&write_mu_);
    written = transport_->Write(request);
  }
  if (!written) {
    bool still_ours;
    {
      absl::MutexLock state(&mu_);
      still_ours = pending_.erase(request.request_id()) > 0;
    }
    const absl::Status ended = EndedAfterFailedWrite();
    // Unless the reader already answered it as an orphan, its callback must still run once.
    if (still_ours) pending->callback(EndedResponse(request.request_id(), ended));
    return ended;
  }
  return absl::OkStatus();
}

absl::Status SessionCore::SendQuiet(v1::SessionRequest request) {
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return EndedLocked();
    request.set_request_id(next_request_++);
  }
  bool written;
  {
    absl::MutexLock lock(&write_mu_);
    written = transport_->Write(request);
  }
  return written ? absl::OkStatus() : EndedAfterFailedWrite();
}

SessionCore::MappedHostBuffer::~MappedHostBuffer() {
  if (device != nullptr) (void)device->UnregisterHostMemory(memory->data());
}

absl::Status SessionCore::OpenHandles(const v1::SessionResponse& response) {
  absl::MutexLock lock(&handles_mu_);
  // The daemon counts every handle here as sent: one that fails must not keep the others from
  // being opened, or later responses would name them without their handles.
  absl::Status first_failure;
  for (const v1::Handle& handle : response.new_handles()) {
    if (handle.kind() == v1::Handle::SLAB) {
      if (slabs_.count(handle.id()) > 0) continue;
      absl::StatusOr<std::unique_ptr<Slab>> slab = device_->OpenSlab(handle.handle());
      if (!slab.ok()) {
        first_failure.Update(absl::Status(
            slab.status().code(),
            absl::StrCat("opening staging slab ", handle.id(), ": ", slab.status().message())));
        continue;
      }
      slabs_[handle.id()] = *std::move(slab);
    } else if (handle.kind() == v1::Handle::EVENT) {
      if (events_.count(handle.id()) > 0) continue;
      absl::StatusOr<std::unique_ptr<Event>> event = device_->OpenEvent(handle.handle());
      if (!event.ok()) {
        first_failure.Update(absl::Status(
            event.status().code(),
            absl::StrCat("opening event ", handle.id(), ": ", event.status().message())));
        continue;
      }
      events_[handle.id()] = *std::move(event);
    } else if (handle.kind() == v1::Handle::HOST_BUFFER) {
      if (host_buffers_.count(handle.id()) > 0) continue;
      absl::Status opened = OpenHostBufferLocked(handle);
      if (!opened.ok()) {
        first_failure.Update(absl::Status(
            opened.code(),
            absl::StrCat("opening host buffer ", handle.id(), ": ", opened.message())));
      }
    }
  }
  return first_failure;
}

absl::Status SessionCore::OpenHostBufferLocked(const v1::Handle& handle) {
  ASSIGN_OR_RETURN(std::unique_ptr<SharedMemory> memory, SharedMemory::Open(handle.handle()));
  if (memory->size() < handle.size()) {
    return absl::InternalError(absl::StrCat(handle.handle(), " has ", memory->size(),
                                            " bytes, the daemon said ", handle.size()));
  }
  auto mapped = std::make_unique<MappedHostBuffer>();
  mapped->memory = std::move(memory);
  // Registered so the copies out of it run at full speed and asynchronously.
  RETURN_IF_ERROR(device_->RegisterHostMemory(mapped->memory->data(), mapped->memory->size()));
  mapped->device = device_;
  host_buffers_[handle.id()] = std::move(mapped);
  return absl::OkStatus();
}

absl::StatusOr<const SharedMemory*> SessionCore::host_buffer(uint32_t id) {
  absl::MutexLock lock(&handles_mu_);
  auto it = host_buffers_.find(id);
  if (it == host_buffers_.end()) {
    return absl::InternalError(
        absl::StrCat("the daemon named host buffer ", id, " without its handle"));
  }
  return it->second->memory.get();
}

absl::StatusOr<Slab*> SessionCore::slab(uint32_t id) {
  absl::MutexLock lock(&handles_mu_);
  return FindHandle(slabs_, id, "slab");
}

absl::StatusOr<Event*> SessionCore::event(uint32_t id) {
  absl::MutexLock lock(&handles_mu_);
  return FindHandle(events_, id, "event");
}

void SessionCore::ReleaseLease(uint64_t lease_id, Event& done_event, Stream& stream) {
  absl::Status status = device_->RecordEvent(done_event, stream);
  if (!status.ok()) {
    // Without the record the daemon could reuse the buffer while the stream still reads it: wait
    // for the stream on the CPU instead.
    std::fprintf(stderr,
                 "tierd client: cannot record the release of lease %llu (%s); waiting "
                 "for the stream instead\n",
                 static_cast<unsigned long long>(lease_id), std::string(status.message()).c_str());
    (void)device_->SynchronizeStream(stream);
  }
  v1::SessionRequest request;
  request.mutable_release()->set_lease_id(lease_id);
  request.mutable_release()->set_quiet(true);
  (void)SendQuiet(std::move(request));
}

}  // namespace tierd
