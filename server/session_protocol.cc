#include "server/session_protocol.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "server/proto_convert.h"
#include "wire/wire_format.h"

namespace tierd {
namespace {

v1::SessionResponse ResponseFor(uint64_t request_id, const absl::Status& status) {
  v1::SessionResponse response;
  response.set_request_id(request_id);
  response.set_code(static_cast<int>(status.code()));
  response.set_message(std::string(status.message()));
  return response;
}

absl::Time DeadlineFromMs(uint32_t deadline_ms) {
  return deadline_ms == 0 ? absl::InfiniteFuture() : absl::Now() + absl::Milliseconds(deadline_ms);
}

}  // namespace

absl::Status CheckKey(const std::string& key, uint32_t max_key_bytes, absl::string_view field) {
  if (key.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  if (key.size() > max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " is ", key.size(), " bytes, longer than the limit of ", max_key_bytes));
  }
  absl::Status split = SplitObjectKey(key).status();
  if (!split.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", split.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::PrefetchResponse> RunPrefetch(GpuTier& tier, const v1::PrefetchRequest& request,
                                                 uint32_t max_key_bytes, absl::string_view field) {
  for (int i = 0; i < request.keys_size(); ++i) {
    RETURN_IF_ERROR(
        CheckKey(request.keys(i), max_key_bytes, absl::StrCat(field, ".keys[", i, "]")));
  }
  const absl::Time deadline = DeadlineFromMs(request.deadline_ms());
  v1::PrefetchResponse response;
  for (const std::string& key : request.keys()) {
    ASSIGN_OR_RETURN(const bool started, tier.Prefetch(key, deadline, request.host_only()));
    response.set_started(response.started() + (started ? 1 : 0));
  }
  return response;
}

absl::StatusOr<v1::EvictResponse> RunEvict(GpuTier& tier, const v1::EvictRequest& request,
                                           uint32_t max_key_bytes, absl::string_view field) {
  ASSIGN_OR_RETURN(const EvictTier evict_tier, FromProto(request.tier()));
  if (request.key().empty() || request.key().size() > max_key_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".key must be a key or a prefix ending in '/' of at most ",
                     max_key_bytes, " bytes"));
  }
  ASSIGN_OR_RETURN(const EvictResult result, tier.Evict(request.key(), evict_tier));
  v1::EvictResponse response;
  response.set_evicted(result.evicted);
  response.set_skipped(result.skipped);
  return response;
}

SessionProtocol::SessionProtocol(GpuTier& tier, SessionOptions options, Send send,
                                 std::optional<pid_t> peer_pid)
    : tier_(tier),
      options_(std::move(options)),
      send_(std::move(send)),
      host_leases_(
          options_.host_lender == nullptr || !peer_pid.has_value()
              ? nullptr
              : std::make_shared<HostLeases>(*options_.host_lender, options_.limits.max_leases,
                                             options_.limits.max_staging_bytes, *peer_pid)) {}

SessionProtocol::~SessionProtocol() = default;

void SessionProtocol::Close() {
  ClientId client;
  std::string name;
  std::function<void()> on_closed;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    client = client_;
    name = client_name_;
    on_closed = std::move(on_closed_);
  }
  const size_t host_leases = host_leases_ != nullptr ? host_leases_->ReleaseAll() : 0;
  if (client != 0) {
    const ClosedClient freed = tier_.CloseClient(client);
    if (freed.leases + freed.reservations + freed.pins + host_leases > 0) {
      TIERD_LOG(INFO) << "session " << client << " (\"" << name << "\") ended holding "
                      << freed.leases << " lease(s), " << host_leases << " host lease(s), "
                      << freed.reservations << " reservation(s) and " << freed.pins
                      << " pin(s); freed";
    } else {
      TIERD_VLOG(1) << "session " << client << " (\"" << name << "\") ended";
    }
  }
  if (on_closed) on_closed();
}

void SessionProtocol::CloseWhenAnswered(std::function<void()> on_closed) {
  bool already_closed;
  bool close_now = false;
  {
    absl::MutexLock lock(&mu_);
    already_closed = closed_;
    if (!already_closed) {
      close_when_answered_ = true;
      on_closed_ = std::move(on_closed);
      close_now = AllAnsweredLocked();
    }
  }
  if (already_closed) {
    on_closed();
  } else if (close_now) {
    Close();
  }
}

void SessionProtocol::Reply(uint64_t request_id, const absl::Status& status) {
  v1::SessionResponse response = ResponseFor(request_id, status);
  if (status.ok()) response.mutable_done();
  CountAndSend(std::move(response));
}

void SessionProtocol::EndRequestLocked(absl::StatusCode code) {
  if (options_.counters != nullptr) options_.counters->Count(code);
  --requests_in_flight_;
}

void SessionProtocol::EndQuietly() {
  bool close_now;
  {
    absl::MutexLock lock(&mu_);
    EndRequestLocked(absl::StatusCode::kOk);
    close_now = AllAnsweredLocked();
  }
  if (close_now) Close();
}

void SessionProtocol::CountAndSend(v1::SessionResponse response) {
  {
    absl::MutexLock lock(&mu_);
    EndRequestLocked(static_cast<absl::StatusCode>(response.code()));
    ++answers_being_sent_;
  }
  send_(std::move(response));
  AnswerSent();
}

void SessionProtocol::AnswerSent() {
  bool close_now;
  {
    absl::MutexLock lock(&mu_);
    --answers_being_sent_;
    close_now = AllAnsweredLocked();
  }
  if (close_now) Close();
}

void SessionProtocol::Handle(const v1::SessionRequest& request) {
  const uint64_t id = request.request_id();
  ClientId client;
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    ++requests_in_flight_;
    if (closed_ || close_when_answered_) {
      refused = absl::UnavailableError("the session has ended");
    } else if (requests_in_flight_ > options_.max_requests_in_flight) {
      refused = absl::ResourceExhaustedError(absl::StrCat(
          "this session already has ", options_.max_requests_in_flight,
          " requests in flight (--session-max-requests); wait for answers before sending more"));
    }
    client = client_;
  }
  if (!refused.ok()) return Reply(id, refused);
  if (request.op_case() == v1::SessionRequest::kOpen) return Open(id, request.open());
  if (client == 0 && request.op_case() != v1::SessionRequest::OP_NOT_SET) {
    return Reply(id, absl::FailedPreconditionError("the first request of a session must be open"));
  }
  switch (request.op_case()) {
    case v1::SessionRequest::kFetch:
      return Fetch(id, client, request.fetch());
    case v1::SessionRequest::kRelease: {
      const v1::ReleaseRequest& release = request.release();
      absl::Status released;
      if (HostLeases::IsHostLease(release.lease_id()) && host_leases_ != nullptr) {
        released = host_leases_->Release(release.lease_id());
      } else {
        released = tier_.Release(client, release.lease_id(),
                                 release.has_done_event_id()
                                     ? std::optional<uint32_t>(release.done_event_id())
                                     : std::nullopt);
      }
      if (released.ok() && request.release().quiet()) return EndQuietly();
      return Reply(id, released);
    }
    case v1::SessionRequest::kPrefetch:
      return Prefetch(id, request.prefetch());
    case v1::SessionRequest::kReserve:
      return Reserve(id, client, request.reserve());
    case v1::SessionRequest::kCommit:
      return Commit(id, client, request.commit());
    case v1::SessionRequest::kPin:
      return Pin(id, client, request.pin().key());
    case v1::SessionRequest::kUnpin: {
      absl::Status key = CheckKey(request.unpin().key(), "unpin.key");
      return Reply(id, key.ok() ? tier_.Unpin(client, request.unpin().key()) : key);
    }
    case v1::SessionRequest::kEvict:
      return Evict(id, request.evict());
    case v1::SessionRequest::kRetain:
    case v1::SessionRequest::kUnretain:
    case v1::SessionRequest::kSleep:
    case v1::SessionRequest::kWake:
    case v1::SessionRequest::kListRetained:
      return Retained(id, request);
    case v1::SessionRequest::kOpen:
    case v1::SessionRequest::OP_NOT_SET:
      break;
  }
  Reply(id, absl::InvalidArgumentError("the request names no operation"));
}

void SessionProtocol::Open(uint64_t request_id, const v1::OpenSession& open) {
  if (open.client_name().size() > 256) {
    return Reply(request_id,
                 absl::InvalidArgumentError("open.client_name is longer than 256 bytes"));
  }
  if (open.protocol() != SessionProtocolVersion()) {
    return Reply(request_id, absl::FailedPreconditionError(absl::StrCat(
                                 "the client speaks session protocol ", open.protocol(),
                                 ", this daemon ", SessionProtocolVersion(),
                                 " (open.protocol): use the client of this daemon's release")));
  }
  bool already_open;
  {
    absl::MutexLock lock(&mu_);
    already_open = client_ != 0;
  }
  if (already_open) {
    // Answered without the lock: answering ends the request, which takes it.
    return Reply(request_id, absl::FailedPreconditionError("the session is already open"));
  }
  absl::StatusOr<ClientId> client = tier_.OpenClient(options_.limits);
  if (!client.ok()) return Reply(request_id, client.status());
  bool raced;
  {
    absl::MutexLock lock(&mu_);
    raced = client_ != 0 || closed_;  // another open, or Close
    if (!raced) {
      client_ = *client;
      client_name_ = open.client_name();
    }
  }
  if (raced) {
    tier_.CloseClient(*client);
    return Reply(request_id, absl::FailedPreconditionError("the session is already open"));
  }
  TIERD_VLOG(1) << "session " << *client << " opened by \"" << open.client_name() << "\"";
  v1::SessionResponse response = ResponseFor(request_id, absl::OkStatus());
  v1::SessionOpened* opened = response.mutable_opened();
  opened->set_session_id(*client);
  opened->set_backend(options_.backend);
  opened->set_device(options_.device);
  opened->set_device_ordinal(options_.device_ordinal);
  opened->set_max_leases(options_.limits.max_leases);
  opened->set_max_staging_bytes(options_.limits.max_staging_bytes);
  opened->set_protocol(SessionProtocolVersion());
  const std::vector<uint32_t> done_events = tier_.DoneEvents(*client);
  for (uint32_t event : done_events) opened->add_done_event_ids(event);
  // Another daemon of the node maps the arena ahead of its first lease.
  const HostHandle host =
      open.node_daemon() && host_leases_ != nullptr ? HostHandle::kArena : HostHandle::kNone;
  SendWithHandles(std::move(response), std::nullopt, host, done_events);
}

void SessionProtocol::SendWithHandles(v1::SessionResponse response, std::optional<uint32_t> slab,
                                      HostHandle host, const std::vector<uint32_t>& events) {
  bool close_now;
  {
    // Attached and sent under one lock: a later response that relies on a handle "already sent"
    // must not overtake the response carrying it.
    absl::MutexLock lock(&mu_);
    if (slab.has_value() && slabs_sent_.insert(*slab).second) {
      ToProto(tier_.pool().SlabInfo(*slab), response.add_new_handles());
    }
    if (host == HostHandle::kArena && !arena_sent_) {
      arena_sent_ = true;
      *response.add_new_handles() = options_.host_lender->ArenaHandle();
    }
    if (host == HostHandle::kHandoffBuffer && !host_buffer_sent_) {
      host_buffer_sent_ = true;
      v1::Handle* handle = response.add_new_handles();
      handle->set_kind(v1::Handle::HOST_BUFFER);
      handle->set_id(HostHandoffBuffer::kHandleId);
      handle->set_handle(tier_.handoff_buffer().handle());
      handle->set_size(tier_.handoff_buffer().size());
    }
    for (uint32_t event : events) {
      if (events_sent_.insert(event).second) {
        ToProto(EventInfo{event, tier_.events().handle(event)}, response.add_new_handles());
      }
    }
    EndRequestLocked(static_cast<absl::StatusCode>(response.code()));
    // Sent under the lock: once the lock is free again this answer is through `send_`, so the
    // request it ended no longer holds up CloseWhenAnswered.
    send_(std::move(response));
    close_now = AllAnsweredLocked();
  }
  if (close_now) Close();
}

void SessionProtocol::Fetch(uint64_t request_id, ClientId client, const v1::FetchRequest& fetch) {
  if (absl::Status key = CheckKey(fetch.key(), "fetch.key"); !key.ok()) {
    return Reply(request_id, key);
  }
  if (fetch.host_lease()) {
    if (fetch.through_host()) {
      return Reply(request_id, absl::InvalidArgumentError(
                                   "fetch.host_lease and fetch.through_host exclude each other"));
    }
    return LendHost(request_id, fetch);
  }
  FetchOptions options;
  options.ask_peers = !fetch.local_only();
  options.through_host = fetch.through_host();
  tier_.Fetch(
      client, fetch.key(), ReadPriority::kDemand, absl::InfiniteFuture(),
      [self = shared_from_this(), request_id](absl::StatusOr<LeaseGrant> grant) {
        if (!grant.ok()) return self->Reply(request_id, grant.status());
        v1::SessionResponse response = ResponseFor(request_id, absl::OkStatus());
        v1::Lease* lease = response.mutable_lease();
        lease->set_lease_id(grant->lease_id);
        lease->set_key(grant->key);
        lease->set_slab_id(grant->range.slab);
        lease->set_offset(grant->range.offset);
        lease->set_length(grant->length);
        std::vector<uint32_t> events;
        if (grant->ready_event) {
          lease->set_ready_event_id(*grant->ready_event);
          events.push_back(*grant->ready_event);
        }
        if (grant->tensors != nullptr) {
          for (const TensorPlacement& tensor : *grant->tensors) {
            ToProto(tensor, lease->add_tensors());
          }
        }
        if (grant->host_offset.has_value()) {
          // The reader may not be able to open a staging slab of this GPU: it is not sent.
          lease->set_host_buffer_id(HostHandoffBuffer::kHandleId);
          lease->set_host_offset(*grant->host_offset);
          return self->SendWithHandles(std::move(response), std::nullopt,
                                       HostHandle::kHandoffBuffer, events);
        }
        self->SendWithHandles(std::move(response), grant->range.slab, HostHandle::kNone, events);
      },
      options);
}

void SessionProtocol::LendHost(uint64_t request_id, const v1::FetchRequest& fetch) {
  if (options_.host_lender == nullptr) {
    return Reply(request_id,
                 absl::PermissionDeniedError(
                     "fetch.host_lease: this daemon lends host memory only as part of a node "
                     "(--peers with --node-host-tier), to sessions of the default client group"));
  }
  if (host_leases_ == nullptr) {
    // Where the borrower's process is not known, a lease its session left held could never be
    // known unused.
    return Reply(request_id, absl::FailedPreconditionError(
                                 "fetch.host_lease: host leases are lent on the session socket "
                                 "only, not on the gRPC Session stream"));
  }
  host_leases_->Lend(fetch.key(), fetch.source_fingerprint(),
                     [self = shared_from_this(), request_id](absl::StatusOr<HostLoan> loan) {
                       if (!loan.ok()) return self->Reply(request_id, loan.status());
                       v1::SessionResponse response = ResponseFor(request_id, absl::OkStatus());
                       v1::Lease* lease = response.mutable_lease();
                       lease->set_lease_id(loan->lease_id);
                       lease->set_key(loan->key);
                       lease->set_length(loan->length);
                       lease->set_host_buffer_id(HostLender::kArenaHandleId);
                       lease->set_host_offset(loan->offset);
                       lease->set_checksum(loan->checksum);
                       lease->set_encoded_length(loan->encoded_length);
                       self->SendWithHandles(std::move(response), std::nullopt, HostHandle::kArena,
                                             {});
                     });
}

void SessionProtocol::Prefetch(uint64_t request_id, const v1::PrefetchRequest& prefetch) {
  absl::StatusOr<v1::PrefetchResponse> result =
      RunPrefetch(tier_, prefetch, options_.max_key_bytes, "prefetch");
  if (!result.ok()) return Reply(request_id, result.status());
  v1::SessionResponse response = ResponseFor(request_id, absl::OkStatus());
  *response.mutable_prefetched() = *std::move(result);
  CountAndSend(std::move(response));
}

void SessionProtocol::Reserve(uint64_t request_id, ClientId client,
                              const v1::ReserveRequest& reserve) {
  if (absl::Status key = CheckKey(reserve.key(), "reserve.key"); !key.ok()) {
    return Reply(request_id, key);
  }
  if (reserve.length() == 0) {
    return Reply(request_id, absl::InvalidArgumentError("reserve.length must be greater than 0"));
  }
  if (static_cast<uint32_t>(reserve.tensors_size()) > options_.max_tensors) {
    return Reply(request_id,
                 absl::InvalidArgumentError(absl::StrCat("reserve.tensors has more than ",
                                                         options_.max_tensors, " entries")));
  }
  absl::StatusOr<std::vector<TensorPlacement>> tensors =
      FromProto(reserve.tensors(), reserve.length(), "reserve.tensors");
  if (!tensors.ok()) return Reply(request_id, tensors.status());
  tier_.Reserve(client, reserve.key(), reserve.length(), *std::move(tensors),
                StorePolicy{reserve.spillable(), reserve.durable()},
                [self = shared_from_this(), request_id](absl::StatusOr<ReservationGrant> grant) {
                  if (!grant.ok()) return self->Reply(request_id, grant.status());
                  v1::SessionResponse response = ResponseFor(request_id, absl::OkStatus());
                  v1::Reservation* reservation = response.mutable_reservation();
                  reservation->set_reservation_id(grant->reservation_id);
                  reservation->set_key(grant->key);
                  reservation->set_slab_id(grant->range.slab);
                  reservation->set_offset(grant->range.offset);
                  reservation->set_length(grant->length);
                  self->SendWithHandles(std::move(response), grant->range.slab, HostHandle::kNone,
                                        {});
                });
}

void SessionProtocol::Commit(uint64_t request_id, ClientId client,
                             const v1::CommitRequest& commit) {
  tier_.Commit(client, commit.reservation_id(), commit.abort(),
               commit.has_written_event_id() ? std::optional<uint32_t>(commit.written_event_id())
                                             : std::nullopt,
               [self = shared_from_this(), request_id](absl::Status status) {
                 self->Reply(request_id, status);
               });
}

void SessionProtocol::Pin(uint64_t request_id, ClientId client, const std::string& key) {
  if (absl::Status valid = CheckKey(key, "pin.key"); !valid.ok()) {
    return Reply(request_id, valid);
  }
  tier_.Pin(client, key, [self = shared_from_this(), request_id](absl::Status status) {
    self->Reply(request_id, status);
  });
}

void SessionProtocol::Evict(uint64_t request_id, const v1::EvictRequest& evict) {
  absl::StatusOr<v1::EvictResponse> result =
      RunEvict(tier_, evict, options_.max_key_bytes, "evict");
  if (!result.ok()) return Reply(request_id, result.status());
  v1::SessionResponse response = ResponseFor(request_id, absl::OkStatus());
  *response.mutable_evicted() = *std::move(result);
  CountAndSend(std::move(response));
}

namespace {


v1::RetainedSet ToProto(const RetainedSetInfo& info) {
  v1::RetainedSet set;
  set.set_target(info.target);
  set.set_objects(info.objects);
  set.set_bytes(info.bytes);
  set.set_ttl_ms(absl::ToInt64Milliseconds(info.ttl));
  set.set_asleep(info.asleep);
  set.set_idle_ms(absl::ToInt64Milliseconds(info.idle));
  set.set_moved(info.moved);
  return set;
}

}  // namespace

void SessionProtocol::Retained(uint64_t request_id, const v1::SessionRequest& request) {
  RetainedSets& sets = tier_.retained();
  auto answer_set = [self = shared_from_this(),
                     request_id](absl::StatusOr<RetainedSetInfo> info) {
    if (!info.ok()) return self->Reply(request_id, info.status());
    v1::SessionResponse response = ResponseFor(request_id, absl::OkStatus());
    *response.mutable_retained() = ToProto(*info);
    self->CountAndSend(std::move(response));
  };
  switch (request.op_case()) {
    case v1::SessionRequest::kRetain: {
      const v1::RetainRequest& retain = request.retain();
      if (retain.ttl_ms() >
          static_cast<uint64_t>(absl::ToInt64Milliseconds(RetainedSets::kMaxTtl))) {
        return Reply(request_id, absl::InvalidArgumentError(
                                     "retain.ttl_ms is more than a year; 0 keeps the set until "
                                     "it is released"));
      }
      return sets.Retain(retain.target(), absl::Milliseconds(retain.ttl_ms()),
                         std::move(answer_set));
    }
    case v1::SessionRequest::kUnretain: {
      const std::string& target = request.unretain().target();
      absl::Status valid = CheckRetainTarget(target, "unretain.target");
      return Reply(request_id, valid.ok() ? sets.Release(target) : valid);
    }
    case v1::SessionRequest::kSleep: {
      const std::string& target = request.sleep().target();
      if (absl::Status valid = CheckRetainTarget(target, "sleep.target"); !valid.ok()) {
        return Reply(request_id, valid);
      }
      return sets.Sleep(target, std::move(answer_set));
    }
    case v1::SessionRequest::kWake: {
      const std::string& target = request.wake().target();
      if (absl::Status valid = CheckRetainTarget(target, "wake.target"); !valid.ok()) {
        return Reply(request_id, valid);
      }
      return sets.Wake(target, std::move(answer_set));
    }
    default: {
      v1::SessionResponse response = ResponseFor(request_id, absl::OkStatus());
      v1::RetainedSets* listed = response.mutable_retained_sets();
      for (const RetainedSetInfo& info : sets.List()) *listed->add_sets() = ToProto(info);
      const RetainedSetsStats stats = sets.stats();
      listed->set_bytes(stats.bytes);
      listed->set_budget_bytes(stats.budget_bytes);
      return CountAndSend(std::move(response));
    }
  }
}

}  // namespace tierd
