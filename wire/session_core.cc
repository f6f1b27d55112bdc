#include "wire/session_core.h"

#include <cstdio>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/status_macros.h"
#include "wire/detail/opened_handles.h"
#include "wire/wire_format.h"

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

void LogFailure(const v1::SessionResponse& response) {
  std::fprintf(stderr, "tierd client: request %llu failed: %s\n",
               static_cast<unsigned long long>(response.request_id()), response.message().c_str());
}

}  // namespace

absl::Status StatusOf(const v1::SessionResponse& response) {
  if (response.code() == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(response.code()), response.message());
}

SessionCore::SessionCore() : handles_(std::make_unique<detail::OpenedHandles>()) {}

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
    // Handles are opened here, in response order, so a later response that names one finds it;
    // the open answer's, before the device is known, by Opened.
    if (response.new_handles_size() > 0 && device_ != nullptr) {
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

absl::StatusOr<SessionCore::Submitted> SessionCore::Submit(v1::SessionRequest& request,
                                                           std::shared_ptr<Pending> pending) {
  const bool registered = pending != nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return EndedLocked();
    request.set_request_id(next_request_++);
    if (registered) pending_[request.request_id()] = std::move(pending);
  }
  bool written;
  {
    absl::MutexLock lock(&write_mu_);
    written = transport_->Write(request);
  }
  if (written) return Submitted::kWritten;
  absl::MutexLock lock(&mu_);
  // A request nobody registered (SendQuiet) has nobody to answer it either.
  const bool unanswered = !registered || pending_.erase(request.request_id()) > 0;
  return unanswered ? Submitted::kFailedUnanswered : Submitted::kFailedAnswered;
}

absl::StatusOr<v1::SessionResponse> SessionCore::Call(v1::SessionRequest request) {
  auto pending = std::make_shared<Pending>();
  ASSIGN_OR_RETURN(const Submitted submitted, Submit(request, pending));
  // Unless the reader already answered it as an orphan (with the reason), say why here.
  if (submitted == Submitted::kFailedUnanswered) return EndedAfterFailedWrite();
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
  ASSIGN_OR_RETURN(const Submitted submitted, Submit(request, pending));
  if (submitted == Submitted::kWritten) return absl::OkStatus();
  const absl::Status ended = EndedAfterFailedWrite();
  // Unless the reader already answered it as an orphan, its callback must still run once.
  if (submitted == Submitted::kFailedUnanswered) {
    pending->callback(EndedResponse(request.request_id(), ended));
  }
  return ended;
}

absl::Status SessionCore::SendQuiet(v1::SessionRequest request) {
  ASSIGN_OR_RETURN(const Submitted submitted, Submit(request, nullptr));
  return submitted == Submitted::kWritten ? absl::OkStatus() : EndedAfterFailedWrite();
}

absl::Status SessionCore::OpenHandles(const v1::SessionResponse& response) {
  return handles_->Open(response, device_);
}

absl::StatusOr<Slab*> SessionCore::slab(uint32_t id) { return handles_->slab(id); }

absl::StatusOr<Event*> SessionCore::event(uint32_t id) { return handles_->event(id); }

absl::StatusOr<const SharedMemory*> SessionCore::host_buffer(uint32_t id) {
  return handles_->host_buffer(id);
}

absl::Status SessionCore::Opened(const v1::SessionResponse& open_answer) {
  if (open_answer.opened().protocol() != SessionProtocolVersion()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the daemon speaks session protocol ", open_answer.opened().protocol(), ", this client ",
        SessionProtocolVersion(), ": use the client of the daemon's release"));
  }
  RETURN_IF_ERROR(OpenHandles(open_answer));
  std::vector<DoneEvents::Opened> events;
  for (uint32_t id : open_answer.opened().done_event_ids()) {
    ASSIGN_OR_RETURN(Event * event, handles_->event(id));
    events.push_back({id, event});
  }
  done_events_ = std::make_unique<DoneEvents>(*device_, std::move(events));
  return absl::OkStatus();
}

absl::StatusOr<std::optional<uint32_t>> SessionCore::RecordDone(Stream& stream, const char* what,
                                                                uint64_t id) {
  return done_events_->RecordAfter(stream, what, id);
}

void SessionCore::ReleaseLease(uint64_t lease_id, Stream& stream) {
  if (ended()) return;
  v1::SessionRequest request;
  v1::ReleaseRequest* release = request.mutable_release();
  release->set_lease_id(lease_id);
  release->set_quiet(true);
  absl::StatusOr<std::optional<uint32_t>> done = RecordDone(stream, "lease", lease_id);
  // Without a record or a finished stream the buffer may still be read: the lease stays held until
  // the session ends.
  if (!done.ok()) return;
  if (done->has_value()) release->set_done_event_id(**done);
  (void)SendQuiet(std::move(request));
}

}  // namespace tierd
