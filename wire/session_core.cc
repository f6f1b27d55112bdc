#include "wire/session_core.h"

#include <cstdio>
#include <iterator>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "wire/detail/opened_handles.h"
#include "wire/wire_format.h"

namespace tierd {

struct SessionCore::Pending {
  bool answered = false;  // guarded by the core's mu_, like `response` of a synchronous call
  absl::StatusOr<v1::SessionResponse> response;
  std::function<void(const v1::SessionResponse&)> callback;  // asynchronous requests
};

namespace {

constexpr absl::string_view kEnded = "the session with tierd has ended";
// How long a caller whose write failed waits for the reader to learn why the stream ended: at
// once, unless the machine is very busy.
constexpr absl::Duration kEndReasonWait = absl::Seconds(2);

// The session whose transport this thread reads now, if any: callbacks it runs may send, and must
// not wait for their own reader.
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
  core->reader_ = std::thread([raw = core.get()] { raw->ReaderThread(); });
  return core;
}

SessionCore::~SessionCore() {
  Close();
  transport_.reset();
}

void SessionCore::Close() {
  if (!reader_.joinable()) return;  // closed already
  {
    absl::MutexLock lock(&write_mu_);
    transport_->CloseWrites();
  }
  bool ended;
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;  // the reader thread reads the answers still on their way, then the end
    ended = mu_.AwaitWithTimeout(absl::Condition(
                                     +[](bool* ended) { return *ended; }, &ended_),
                                 kCloseGrace);
  }
  // A daemon that hangs never ends it: cut, so that the reader comes back.
  if (!ended) transport_->Abort();
  reader_.join();
}

bool SessionCore::ReaderThreadWantedLocked() const {
  return closing_ || end_wanted_ || callbacks_owed_ > 0;
}

void SessionCore::ReaderThread() {
  absl::MutexLock lock(&mu_);
  while (!ended_) {
    // Never while a caller holds the role or waits to take it: it reads for everyone.
    const bool role_free = !reading_ && callers_waiting_ == 0;
    if (!role_free ||
        (!ReaderThreadWantedLocked() && absl::Now() - role_free_since_ < kIdleWatch)) {
      mu_.AwaitWithTimeout(absl::Condition(
                               +[](SessionCore* core) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                 return core->ended_ ||
                                        (!core->reading_ && core->callers_waiting_ == 0 &&
                                         core->ReaderThreadWantedLocked());
                               },
                               this),
                           kIdleWatch);
      continue;
    }
    reading_ = true;
    ReadWhileReader(nullptr);
  }
}

void SessionCore::ReadWhileReader(const Pending* mine) {
  const SessionCore* const outer = reading_session;
  reading_session = this;
  bool answered_a_call = false;
  while (!ended_) {
    if (mine != nullptr) {
      if (mine->answered) break;
    } else if (callers_waiting_ > 0 || answered_a_call) {
      break;  // callers read for themselves from here
    }
    mu_.Unlock();
    v1::SessionResponse response;
    if (transport_->Read(response)) {
      answered_a_call = Dispatch(response);
    } else {
      EndStream();
    }
    mu_.Lock();
  }
  reading_ = false;
  role_free_since_ = absl::Now();
  reading_session = outer;
}

bool SessionCore::Dispatch(v1::SessionResponse& response) {
  std::shared_ptr<Pending> pending;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(response.request_id());
    if (it == pending_.end()) {
      // A quiet request's failure (nobody waits for it), or an answer nobody asked for.
      if (response.code() != 0) LogFailure(response);
      return false;
    }
    pending = std::move(it->second);
    pending_.erase(it);
    if (pending->callback) --callbacks_owed_;
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
    return false;
  }
  absl::MutexLock lock(&mu_);
  pending->response = std::move(response);
  pending->answered = true;
  return true;
}

void SessionCore::EndStream() {
  absl::Status reason;
  {
    // gRPC lets a Read run beside a Write, but not Finish.
    absl::MutexLock lock(&write_mu_);
    reason = transport_->Finish();
  }
  std::vector<std::pair<uint64_t, std::shared_ptr<Pending>>> callbacks;
  absl::Status ended;
  {
    absl::MutexLock lock(&mu_);
    ended_ = true;
    end_reason_ = reason;
    ended = EndedLocked();
    for (auto& [id, pending] : pending_) {
      if (pending->callback) {
        callbacks.emplace_back(id, std::move(pending));
      } else {
        pending->response = ended;
        pending->answered = true;
      }
    }
    pending_.clear();
    callbacks_owed_ = 0;
  }
  for (auto& [id, pending] : callbacks) pending->callback(EndedResponse(id, ended));
}

absl::Status SessionCore::EndedLocked() const {
  if (end_reason_.ok()) return absl::UnavailableError(kEnded);
  return absl::UnavailableError(absl::StrCat(kEnded, ": ", end_reason_.message()));
}

absl::Status SessionCore::EndedAfterFailedWrite() {
  absl::MutexLock lock(&mu_);
  if (reading_session != this) {
    end_wanted_ = true;  // whoever reads next reads on to the end
    mu_.AwaitWithTimeout(absl::Condition(&ended_), kEndReasonWait);
  }
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
  std::vector<Submitted> submitted;
  RETURN_IF_ERROR(
      SubmitAll(absl::MakeSpan(&request, 1), absl::MakeConstSpan(&pending, 1), submitted));
  return submitted.front();
}

absl::Status SessionCore::SubmitAll(absl::Span<v1::SessionRequest> requests,
                                    absl::Span<const std::shared_ptr<Pending>> pendings,
                                    std::vector<Submitted>& submitted) {
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return EndedLocked();
    for (size_t i = 0; i < requests.size(); ++i) {
      requests[i].set_request_id(next_request_++);
      if (pendings[i] != nullptr) {
        if (pendings[i]->callback) ++callbacks_owed_;
        pending_[requests[i].request_id()] = pendings[i];
      }
    }
  }
  bool written;
  {
    absl::MutexLock lock(&write_mu_);
    written = requests.size() == 1 ? transport_->Write(requests.front())
                                   : transport_->WriteMany(requests);
  }
  submitted.assign(requests.size(), Submitted::kWritten);
  if (written) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < requests.size(); ++i) {
    // A request nobody registered (a quiet one) has nobody to answer it either.
    const bool registered = pendings[i] != nullptr;
    auto it = registered ? pending_.find(requests[i].request_id()) : pending_.end();
    const bool unanswered = !registered || it != pending_.end();
    if (it != pending_.end()) {
      if (it->second->callback) --callbacks_owed_;
      pending_.erase(it);
    }
    submitted[i] = unanswered ? Submitted::kFailedUnanswered : Submitted::kFailedAnswered;
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::SessionResponse> SessionCore::Call(v1::SessionRequest request) {
  auto pending = std::make_shared<Pending>();
  ASSIGN_OR_RETURN(const Submitted submitted, Submit(request, pending));
  // Unless the reader already answered it as an orphan (with the reason), say why here.
  if (submitted == Submitted::kFailedUnanswered) return EndedAfterFailedWrite();
  {
    absl::MutexLock lock(&mu_);
    AwaitAnswerLocked(*pending);
  }
  if (!pending->response.ok()) return pending->response.status();
  if (absl::Status status = StatusOf(*pending->response); !status.ok()) return status;
  return std::move(pending->response);
}

void SessionCore::AwaitAnswerLocked(const Pending& pending) {
  while (!pending.answered) {
    if (!reading_) {
      // Nobody reads: this thread does, until its own answer comes, so that the answer wakes it
      // and not a reader thread that would then have to wake it. (Once the session has ended
      // every request has its answer: ended_ is never set here.)
      reading_ = true;
      ReadWhileReader(&pending);
      continue;
    }
    ++callers_waiting_;
    std::pair<const SessionCore*, const Pending*> args(this, &pending);
    mu_.Await(absl::Condition(
        +[](std::pair<const SessionCore*, const Pending*>* args) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return args->second->answered || !args->first->reading_;
        },
        &args));
    --callers_waiting_;
  }
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

std::vector<absl::StatusOr<v1::SessionResponse>> SessionCore::CallMany(
    std::vector<v1::SessionRequest> quiet, std::vector<v1::SessionRequest> calls) {
  std::vector<v1::SessionRequest> requests = std::move(quiet);
  const size_t first_call = requests.size();
  std::move(calls.begin(), calls.end(), std::back_inserter(requests));
  std::vector<std::shared_ptr<Pending>> pendings(requests.size());
  for (size_t i = first_call; i < requests.size(); ++i) pendings[i] = std::make_shared<Pending>();
  std::vector<Submitted> submitted;
  std::vector<absl::StatusOr<v1::SessionResponse>> answers;
  answers.reserve(requests.size() - first_call);
  if (absl::Status sent = SubmitAll(absl::MakeSpan(requests), pendings, submitted); !sent.ok()) {
    answers.assign(requests.size() - first_call, sent);
    return answers;
  }
  std::optional<absl::Status> ended;  // learned once, when a call needs it
  for (size_t i = first_call; i < requests.size(); ++i) {
    // Unless the reader already answered it as an orphan (with the reason), say why here.
    if (submitted[i] == Submitted::kFailedUnanswered) {
      if (!ended.has_value()) ended = EndedAfterFailedWrite();
      answers.push_back(*ended);
      continue;
    }
    Pending& pending = *pendings[i];
    {
      absl::MutexLock lock(&mu_);
      AwaitAnswerLocked(pending);
    }
    if (pending.response.ok()) {
      if (absl::Status status = StatusOf(*pending.response); !status.ok())
        pending.response = status;
    }
    answers.push_back(std::move(pending.response));
  }
  return answers;
}

absl::Status SessionCore::OpenHandles(const v1::SessionResponse& response) {
  return handles_->Open(response, device_);
}

absl::StatusOr<Slab*> SessionCore::slab(uint32_t id) { return handles_->slab(id); }

absl::StatusOr<Event*> SessionCore::event(uint32_t id) { return handles_->event(id); }

absl::StatusOr<const SharedMemory*> SessionCore::host_buffer(uint32_t id) {
  return handles_->host_buffer(id);
}

absl::StatusOr<PeerArena*> SessionCore::host_arena(uint32_t id) { return handles_->host_arena(id); }

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
  for (v1::SessionRequest& release : PrepareReleases({lease_id}, stream)) {
    (void)SendQuiet(std::move(release));
  }
}

std::vector<v1::SessionRequest> SessionCore::PrepareReleases(const std::vector<uint64_t>& lease_ids,
                                                             Stream& stream) {
  std::vector<v1::SessionRequest> requests;
  if (lease_ids.empty() || ended()) return requests;
  absl::StatusOr<std::optional<uint32_t>> done = RecordDone(stream, "lease", lease_ids.front());
  // Without a record or a finished stream the buffers may still be read: the leases stay held
  // until the session ends.
  if (!done.ok()) return requests;
  for (uint64_t lease_id : lease_ids) {
    v1::ReleaseRequest* release = requests.emplace_back().mutable_release();
    release->set_lease_id(lease_id);
    release->set_quiet(true);
    if (done->has_value()) release->set_done_event_id(**done);
  }
  return requests;
}

}  // namespace tierd
