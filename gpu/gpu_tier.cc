#include "gpu/gpu_tier.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/deferred_calls.h"
#include "common/leak_on_purpose.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "gpu/gpu_tier_internal.h"

namespace tierd {

absl::Status ClientGone() { return absl::UnavailableError("the session has ended"); }

absl::Status LargerThanSlab(const std::string& key, uint64_t bytes, uint64_t slab_bytes) {
  return absl::ResourceExhaustedError(
      absl::StrCat(key, " is ", FormatByteSize(bytes), ", larger than a GPU staging slab (",
                   FormatByteSize(slab_bytes), "): raise --gpu-slab-bytes"));
}

absl::Status CheckStagingQuota(const ClientLimits& limits, uint64_t held, const std::string& key,
                               uint64_t bytes) {
  if (held + bytes <= limits.max_staging_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("the session's staging quota of ", FormatByteSize(limits.max_staging_bytes),
                   " would be exceeded (", FormatByteSize(held), " held, ", key, " is ",
                   FormatByteSize(bytes), ")"));
}

absl::StatusOr<std::unique_ptr<GpuTier>> GpuTier::Create(Device& device, Catalog& catalog,
                                                         HostArena& arena, HostCache& host_cache,
                                                         const GpuTierOptions& options) {
  if (options.copy_chunk_bytes == 0) {
    return absl::InvalidArgumentError("the copy chunk size must be greater than 0");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<StagingPool> pool,
                   StagingPool::Create(device, options.pool_bytes, options.slab_bytes));
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> demand, device.CreateStream(StreamPriority::kHigh));
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> prefetch, device.CreateStream(StreamPriority::kNormal));
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> store, device.CreateStream(StreamPriority::kNormal));
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> handoff, device.CreateStream(StreamPriority::kHigh));
  return std::unique_ptr<GpuTier>(
      new GpuTier(device, catalog, arena, host_cache, options, std::move(pool), std::move(demand),
                  std::move(prefetch), std::move(store), std::move(handoff)));
}

GpuTier::GpuTier(Device& device, Catalog& catalog, HostArena& arena, HostCache& host_cache,
                 const GpuTierOptions& options, std::unique_ptr<StagingPool> pool,
                 std::unique_ptr<Stream> demand_stream, std::unique_ptr<Stream> prefetch_stream,
                 std::unique_ptr<Stream> store_stream, std::unique_ptr<Stream> handoff_stream)
    : device_(device),
      catalog_(catalog),
      arena_(arena),
      host_cache_(host_cache),
      options_(options),
      pool_(std::move(pool)),
      events_(device, options.max_events),
      handoff_buffer_(std::make_unique<HostHandoffBuffer>(device, options.handoff_buffer_bytes)),
      demand_stream_(std::move(demand_stream)),
      prefetch_stream_(std::move(prefetch_stream)),
      store_stream_(std::move(store_stream)),
      handoff_stream_(std::move(handoff_stream)),
      liveness_(std::make_shared<Liveness>()) {
  absl::MutexLock lock(&liveness_->mu);
  liveness_->tier = this;
}

GpuTier::~GpuTier() {
  std::vector<ClientId> open;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, client] : clients_) open.push_back(id);
  }
  for (ClientId id : open) {
    CloseClient(id);
    ForceClose(id);
  }
  {
    // Copies, commits and host and peer fetches in flight call back into the tier; wait for them,
    // and for the callbacks still running the calls they deferred past the lock.
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](GpuTier* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return self->copies_in_flight_ == 0 && self->host_fetches_in_flight_ == 0 &&
                 self->callbacks_running_ == 0 && self->peer_fetches_in_flight_ == 0 &&
                 self->host_reservations_in_flight_ == 0 && self->commits_.empty();
        },
        this));
  }
  if (handoff_buffer_->allocated()) {
    // Copies into the handoff buffer for peers may still run: the buffer is unregistered below.
    if (absl::Status idle = device_.SynchronizeStream(*handoff_stream_); !idle.ok()) {
      TIERD_LOG(WARNING) << "waiting for the handoff stream: " << idle;
    }
  }
  {
    absl::MutexLock lock(&liveness_->mu);
    liveness_->tier = nullptr;
  }
  absl::MutexLock lock(&mu_);
  for (auto& [key, object] : objects_) delete object;
  objects_.clear();
  if (abandoned_waits_ > 0) {
    // Freeing device memory waits for every stream of the device, among them drain streams
    // waiting on events that dead clients will never record. The process's exit frees it instead.
    TIERD_LOG(WARNING) << abandoned_waits_
                       << " wait(s) on events of clients that died with work queued may never "
                          "complete; the staging pool is left to the process's exit";
    LeakOnPurpose(pool_);
  }
}

absl::StatusOr<std::string> GpuTier::OwnHostKey(const std::string& key) const {
  {
    absl::MutexLock lock(&mu_);
    if (stored_.count(key) > 0) return HostKey(key, /*stored=*/true);
  }
  if (!options_.stored_key_prefix.empty() && !catalog_.Lookup(key).ok()) {
    // Not a weight, nor one of this group's objects: whatever the host cache has under this key
    // is someone else's, and not even its existence is this group's business.
    RETURN_IF_ERROR(SplitObjectKey(key).status());
    return absl::NotFoundError(absl::StrCat("no object ", key));
  }
  return key;
}

// ---- Clients ------------------------------------------------------------------------------------

absl::StatusOr<ClientId> GpuTier::OpenClient(const ClientLimits& limits) {
  {
    absl::MutexLock lock(&mu_);
    if (OpenClientsLocked() >= options_.max_clients) return TooManyClients();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device_.CreateStream(StreamPriority::kNormal));
  absl::MutexLock lock(&mu_);
  if (OpenClientsLocked() >= options_.max_clients) return TooManyClients();
  auto client = std::make_unique<Client>();
  client->id = next_client_++;
  client->limits = limits;
  client->drain_stream = std::move(stream);
  const ClientId id = client->id;
  clients_[id] = std::move(client);
  return id;
}

uint32_t GpuTier::OpenClientsLocked() const {
  uint32_t open = 0;
  for (const auto& [id, client] : clients_) open += client->closed ? 0 : 1;
  return open;
}

absl::Status GpuTier::TooManyClients() const {
  return absl::ResourceExhaustedError(
      absl::StrCat("the daemon already has ", options_.max_clients,
                   " sessions open (--max-sessions); close one, or share a session"));
}

GpuTier::Client* GpuTier::FindClientLocked(ClientId id) {
  auto it = clients_.find(id);
  if (it == clients_.end() || it->second->closed) return nullptr;
  return it->second.get();
}

ClosedClient GpuTier::CloseClient(ClientId id) {
  DeferredCalls deferred;
  std::shared_ptr<Stream> stream_to_destroy;
  absl::MutexLock lock(&mu_);
  Client* client = FindClientLocked(id);
  if (client == nullptr) return {};
  client->closed = true;
  const ClosedClient freed{client->leases.size(), client->reservations.size(), client->pins.size()};
  for (auto& [lease_id, lease] : client->leases) {
    Drain drain;
    drain.object = lease.object;
    drain.host_offset = lease.host_offset;
    StartDrainLocked(*client, std::move(drain), lease.done_event);
  }
  client->leases.clear();
  // A reservation's range may still be being written by the client's stream.
  for (auto& [reservation_id, reservation] : client->reservations) {
    Drain drain;
    drain.kind = Drain::Kind::kRange;
    drain.range = reservation.range;
    StartDrainLocked(*client, std::move(drain), reservation.written_event);
  }
  client->reservations.clear();
  for (auto& [key, pin] : client->pins) {
    pin.object->pins -= pin.count;
    stats_.pins -= pin.count;
    if (pin.object->listed) {
      TouchLocked(pin.object);
    } else {
      DeleteIfUnusedLocked(pin.object);
    }
  }
  client->pins.clear();
  client->staging_bytes = 0;
  if (client->drains.empty()) {
    stream_to_destroy = std::move(client->drain_stream);
    clients_.erase(id);
  } else {
    timer_.RunAfter(options_.close_grace, [this, id] { ForceClose(id); });
  }
  RetryAllocationsLocked(deferred.calls());
  // The stream goes after the lock: destroying it may run drain callbacks, which take it.
  deferred.calls().push_back([stream = std::move(stream_to_destroy)]() mutable { stream.reset(); });
  return freed;
}

void GpuTier::ForceClose(ClientId id) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  Client& client = *it->second;
  if (!client.drains.empty()) {
    TIERD_LOG(WARNING) << "session " << id << ": " << client.drains.size()
                       << " release(s) still waiting for the client's done event after "
                       << absl::FormatDuration(options_.close_grace)
                       << "; the client is gone, freeing them";
  }
  const std::set<uint64_t> drains = client.drains;
  for (uint64_t drain : drains) FinishDrainLocked(drain, /*forced=*/true, deferred.calls());
  deferred.calls().push_back(
      [stream = std::move(client.drain_stream)]() mutable { stream.reset(); });
  clients_.erase(it);
}

// ---- Fetch --------------------------------------------------------------------------------------

GpuTier::Object* GpuTier::FindListedLocked(const std::string& key) {
  auto it = objects_.find(key);
  if (it == objects_.end()) return nullptr;
  Object* object = it->second;
  if (object->model != nullptr) {
    // A weight copied from an older registration of its model must never be served.
    if (!catalog_.IsCurrent(object->model)) {
      UnlistLocked(object);
      return nullptr;
    }
  }
  return object;
}

void GpuTier::Fetch(ClientId client_id, const std::string& key, ReadPriority priority,
                    absl::Time deadline, LeaseCallback done, FetchOptions options) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  auto fail = [&](absl::Status status) { DeferAnswer(deferred.calls(), std::move(done), status); };
  Client* client = FindClientLocked(client_id);
  if (client == nullptr) return fail(ClientGone());
  if (client->leases.size() + client->pending_fetches >= client->limits.max_leases) {
    return fail(absl::ResourceExhaustedError(absl::StrCat("the session holds its quota of ",
                                                          client->limits.max_leases,
                                                          " leases: release some first")));
  }
  Object* object = FindListedLocked(key);
  if (object != nullptr && object->state == Object::State::kResident) {
    ++stats_.hits;
    TouchLocked(object);
    return DeferAnswer(deferred.calls(), std::move(done),
                       GrantLocked(*client, object, options.through_host));
  }
  ++stats_.misses;
  if (object == nullptr) {
    absl::StatusOr<Object*> started = StartLoadLocked(key, priority, deadline, deferred.calls());
    if (absl::IsNotFound(started.status()) && options.ask_peers && options_.peers != nullptr) {
      return StartPeerLoadLocked(*client, key, std::move(done), deferred.calls());
    }
    if (!started.ok()) return fail(started.status());
    object = *started;
  } else if (priority == ReadPriority::kDemand && !object->demand) {
    object->demand = true;
    // Promote the host read; whichever answer comes first is used.
    if (object->state == Object::State::kFetchingHost) {
      IssueHostFetchLocked(object, priority, deadline, deferred.calls());
    }
  }
  ++client->pending_fetches;
  object->waiters.push_back({client_id, std::move(done), nullptr, options.through_host});
}

absl::StatusOr<GpuTier::Object*> GpuTier::StartLoadLocked(const std::string& key,
                                                          ReadPriority priority,
                                                          absl::Time deadline, Deferred& deferred) {
  auto object = std::make_unique<Object>();
  object->key = key;
  if (auto stored = stored_.find(key); stored != stored_.end()) {
    object->size = stored->second.size;
    object->tensors = stored->second.tensors;
  } else {
    ASSIGN_OR_RETURN(ObjectRef ref, catalog_.Lookup(key));
    object->size = ref.object->size;
    object->tensors = Tensors(ref.model, &ref.object->tensors);  // aliases the model's lifetime
    object->model = ref.model;
  }
  if (!FitsInSlab(object->size, pool_->largest_slab())) {
    return LargerThanSlab(key, object->size, pool_->largest_slab());
  }
  object->demand = priority == ReadPriority::kDemand;
  object->listed = true;
  Object* raw = object.release();
  objects_[key] = raw;
  IssueHostFetchLocked(raw, priority, deadline, deferred);
  return raw;
}

void GpuTier::IssueHostFetchLocked(Object* object, ReadPriority priority, absl::Time deadline,
                                   Deferred& deferred) {
  ++object->host_fetches;
  ++host_fetches_in_flight_;
  deferred.push_back(
      [this, object, key = HostKey(object->key, object->model == nullptr), priority, deadline] {
        host_cache_.Fetch(key, priority, deadline, [this, object](absl::StatusOr<HostObject> host) {
          OnHostObject(object, std::move(host));
        });
      });
}

void GpuTier::OnHostObject(Object* object, absl::StatusOr<HostObject> host) {
  const RunningCallback running(this);
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  --host_fetches_in_flight_;
  --object->host_fetches;
  if (object->state != Object::State::kFetchingHost) {
    // A promoted fetch answered first; this answer is not needed. Its reference goes after the
    // lock: releasing it can run host-cache callbacks that take the lock.
    if (host.ok())
      deferred.calls().push_back([host = *std::move(host)]() mutable { host.Reset(); });
    DeleteIfUnusedLocked(object);
    return;
  }
  if (!host.ok()) {
    if (object->host_fetches > 0) return;  // the promoted fetch may still succeed
    return FailLoadLocked(object, host.status(), deferred.calls());
  }
  if (host->size() != object->size) {
    return FailLoadLocked(
        object,
        absl::InternalError(absl::StrCat("host tier has ", host->size(), " bytes of ", object->key,
                                         ", expected ", object->size)),
        deferred.calls());
  }
  object->state = Object::State::kAllocating;
  auto shared_host = std::make_shared<HostObject>(*std::move(host));
  AllocateLocked(
      object->size,
      [this, object, shared_host](absl::StatusOr<StagingRange> range) mutable {
        DeferredCalls later;
        absl::MutexLock relock(&mu_);
        if (!range.ok()) {
          later.calls().push_back(
              [shared_host = std::move(shared_host)]() mutable { shared_host.reset(); });
          return FailLoadLocked(object, range.status(), later.calls());
        }
        object->range = *range;
        HostObject host = std::move(*shared_host);
        CopyInLocked(object, std::move(host), later.calls());
      },
      deferred.calls());
}

void GpuTier::CopyInLocked(Object* object, HostObject host, Deferred& deferred) {
  auto shared_host = std::make_shared<HostObject>(std::move(host));
  // The host reference goes after the lock: releasing it can run host-cache callbacks that take it.
  deferred.push_back([shared_host]() mutable { shared_host.reset(); });
  absl::StatusOr<uint32_t> ready = events_.Acquire();
  if (!ready.ok()) return FailLoadLocked(object, ready.status(), deferred);
  object->ready_event = *ready;
  Stream& stream = object->demand ? *demand_stream_ : *prefetch_stream_;
  absl::Status status = CopyChunked(stream, pool_->data(*object->range), shared_host->data(),
                                    object->size, /*host_is_dst=*/false);
  if (status.ok()) status = device_.RecordEvent(events_.event(*ready), stream);
  if (status.ok()) {
    ++copies_in_flight_;
    object->copying = true;
    status = device_.NotifyWhenDone(stream, [this, object, shared_host]() mutable {
      shared_host->Reset();  // no lock is held here
      FinishCopyIn(object, &GpuTierStats::bytes_host_to_gpu);
    });
    if (!status.ok()) {
      --copies_in_flight_;
      object->copying = false;
    }
  }
  if (!status.ok()) {
    FreeAfterStreamLocked(stream, *object->range, object->ready_event,
                          absl::StrCat("copying ", object->key, " to the GPU"), status);
    object->range.reset();
    object->ready_event.reset();
    return FailLoadLocked(
        object,
        absl::Status(status.code(),
                     absl::StrCat("copying ", object->key, " to the GPU: ", status.message())),
        deferred);
  }
  object->state = Object::State::kResident;
  if (object->listed) TouchLocked(object);
  AnswerWaitersLocked(object, absl::OkStatus(), deferred);
}

void GpuTier::FinishCopyIn(Object* object, uint64_t GpuTierStats::*bytes_moved) {
  const RunningCallback running(this);
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  --copies_in_flight_;
  object->copying = false;
  stats_.*bytes_moved += object->size;
  DeleteIfUnusedLocked(object);
  RetryAllocationsLocked(deferred.calls());
}

void GpuTier::FailLoadLocked(Object* object, const absl::Status& status, Deferred& deferred) {
  if (object->range && !object->copying) {
    pool_->Free(*object->range);
    object->range.reset();
  }
  if (object->ready_event && !object->copying) {
    events_.Release(*object->ready_event);
    object->ready_event.reset();
  }
  // Pins taken while loading stay counted until their clients unpin or close; the object is no
  // longer listed, so it is freed then.
  if (object->listed) UnlistLocked(object);
  object->state = Object::State::kFetchingHost;  // not resident: nothing may lease it
  AnswerWaitersLocked(object, status, deferred);
  DeleteIfUnusedLocked(object);
}

void GpuTier::AnswerWaitersLocked(Object* object, const absl::Status& status, Deferred& deferred) {
  std::vector<Object::Waiter> waiters = std::move(object->waiters);
  object->waiters.clear();
  for (Object::Waiter& waiter : waiters) {
    Client* client = FindClientLocked(waiter.client);
    if (waiter.lease) {
      if (client != nullptr) --client->pending_fetches;
      absl::StatusOr<LeaseGrant> grant = !status.ok() ? status
                                         : client == nullptr
                                             ? ClientGone()
                                             : GrantLocked(*client, object, waiter.through_host);
      DeferAnswer(deferred, std::move(waiter.lease), std::move(grant));
    } else {
      if (!status.ok() && client != nullptr) {
        // The pin never took hold: take it back (the caller frees the object).
        auto record = client->pins.find(object->key);
        if (record != client->pins.end() && record->second.object == object) {
          --object->pins;
          --stats_.pins;
          if (--record->second.count == 0) {
            client->staging_bytes -= object->size;
            client->pins.erase(record);
          }
        }
      }
      DeferAnswer(deferred, std::move(waiter.pin), status);
    }
  }
}

absl::StatusOr<LeaseGrant> GpuTier::GrantLocked(Client& client, Object* object, bool through_host) {
  RETURN_IF_ERROR(
      CheckStagingQuota(client.limits, client.staging_bytes, object->key, object->size));
  ASSIGN_OR_RETURN(const uint32_t done_event, events_.Acquire());
  std::optional<uint64_t> host_offset;
  if (through_host) {
    absl::StatusOr<uint64_t> offset = handoff_buffer_->Allocate(object->size);
    if (!offset.ok()) {
      events_.Release(done_event);
      return offset.status();
    }
    if (absl::Status copied = CopyToHandoffBufferLocked(object, *offset, done_event);
        !copied.ok()) {
      // Nothing recorded the event; pieces of the copy may still be queued.
      events_.Release(done_event);
      FreeHandoffRangeLater(*offset, object->size);
      return absl::Status(
          copied.code(),
          absl::StrCat("copying ", object->key, " to the host handoff buffer: ", copied.message()));
    }
    host_offset = *offset;
  }
  const uint64_t lease_id = client.next_lease++;
  client.leases[lease_id] = {object, done_event, host_offset};
  client.staging_bytes += object->size;
  ++object->leases;
  ++stats_.leases;
  LeaseGrant grant;
  grant.lease_id = lease_id;
  grant.key = object->key;
  grant.range = *object->range;
  grant.length = object->size;
  // Through the host, the bytes are where the reader looks once the tier's own record of the done
  // event, after its copy, completes.
  grant.ready_event = through_host ? done_event : *object->ready_event;
  grant.done_event = done_event;
  grant.tensors = object->tensors;
  grant.host_offset = host_offset;
  return grant;
}

absl::Status GpuTier::Release(ClientId client_id, uint64_t lease_id) {
  absl::MutexLock lock(&mu_);
  Client* client = FindClientLocked(client_id);
  if (client == nullptr) return ClientGone();
  auto it = client->leases.find(lease_id);
  if (it == client->leases.end()) {
    if (lease_id > 0 && lease_id < client->next_lease) {
      return absl::FailedPreconditionError(
          absl::StrCat("lease ", lease_id, " was already released"));
    }
    return absl::NotFoundError(absl::StrCat("this session has no lease ", lease_id));
  }
  const Client::Lease lease = it->second;
  client->leases.erase(it);
  client->staging_bytes -= lease.object->size;
  Drain drain;
  drain.object = lease.object;
  drain.host_offset = lease.host_offset;
  StartDrainLocked(*client, std::move(drain), lease.done_event);
  return absl::OkStatus();
}

// ---- Drains -------------------------------------------------------------------------------------

void GpuTier::StartDrainLocked(Client& client, Drain drain, uint32_t event) {
  const uint64_t id = next_drain_++;
  drain.client = client.id;
  drain.event = event;
  drains_[id] = std::move(drain);
  client.drains.insert(id);
  // The device calls are made on the timer thread, not here: a release is on the path of the
  // session's next request (a session's requests are handled in order), and there its device calls
  // slowed the next fetch (bench/results/README.md, "What it took"). The drain is registered
  // already, so its callback finds it; were it forced meanwhile (the session closed), the callback
  // finds it gone and the wait only delays the retired slot's stream, which the stream reference
  // keeps.
  timer_.RunAfter(absl::ZeroDuration(), [this, stream = client.drain_stream, client_id = client.id,
                                         done = &events_.event(event), id] {
    absl::Status status = device_.WaitEvent(*stream, *done);
    if (status.ok()) {
      status = device_.NotifyWhenDone(*stream, [live = liveness_, id] {
        absl::MutexLock lock(&live->mu);
        if (live->tier != nullptr) live->tier->FinishDrain(id);
      });
    }
    if (!status.ok()) {
      // Without the wait nothing says when the client is done: the drain stays pending, so what
      // it holds is freed only by the close grace when the session ends.
      TIERD_LOG(ERROR) << "session " << client_id << ": cannot wait for its event (" << status
                       << "); its buffer is freed when the session ends";
    }
  });
}

void GpuTier::FreeAfterStreamLocked(Stream& stream, StagingRange range,
                                    std::optional<uint32_t> event, const std::string& what,
                                    const absl::Status& error) {
  const absl::Status arranged = device_.NotifyWhenDone(stream, [live = liveness_, range, event] {
    absl::MutexLock lock(&live->mu);
    if (live->tier != nullptr) live->tier->FreeAfterFailedCopy(range, event);
  });
  if (arranged.ok()) {
    TIERD_LOG(ERROR) << what << " failed: " << error
                     << "; its staging range is freed once the stream has run what was queued";
    return;
  }
  TIERD_LOG(ERROR) << what << " failed: " << error << ", and the device cannot say when its "
                   << "stream is done (" << arranged << "); its staging range and event are "
                   << "retired";
}

void GpuTier::FreeAfterFailedCopy(StagingRange range, std::optional<uint32_t> event) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  pool_->Free(range);
  if (event.has_value()) events_.Release(*event);
  RetryAllocationsLocked(deferred.calls());
}

void GpuTier::FinishDrain(uint64_t drain_id) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  FinishDrainLocked(drain_id, /*forced=*/false, deferred.calls());
}

void GpuTier::FinishDrainLocked(uint64_t drain_id, bool forced, Deferred& deferred) {
  auto it = drains_.find(drain_id);
  if (it == drains_.end()) return;  // forced earlier
  Drain drain = std::move(it->second);
  drains_.erase(it);
  if (auto client = clients_.find(drain.client); client != clients_.end()) {
    client->second->drains.erase(drain_id);
  }
  // A forced drain's event may still have a record pending that will never complete; a later
  // owner would wait on it forever. Retire the slot instead.
  if (forced) {
    ++abandoned_waits_;
  } else {
    events_.Release(drain.event);
  }
  switch (drain.kind) {
    case Drain::Kind::kLease:
      if (drain.host_offset.has_value()) {
        // A forced drain's event says nothing: the copy into the range may still be queued.
        if (forced) {
          FreeHandoffRangeLater(*drain.host_offset, drain.object->size);
        } else {
          handoff_buffer_->Free(*drain.host_offset, drain.object->size);
        }
      }
      --drain.object->leases;
      --stats_.leases;
      if (drain.object->listed) {
        TouchLocked(drain.object);
      } else {
        DeleteIfUnusedLocked(drain.object);
      }
      break;
    case Drain::Kind::kRange:
      pool_->Free(*drain.range);
      --stats_.reservations;
      break;
    case Drain::Kind::kCommit:
      if (forced) {
        FailCommitLocked(drain.commit, ClientGone(), deferred);
      } else {
        WrittenLocked(drain.commit, deferred);
      }
      break;
  }
  RetryAllocationsLocked(deferred);
}

// ---- Staging room -------------------------------------------------------------------------------

bool GpuTier::IsEvictableLocked(const Object* object) const {
  return object->state == Object::State::kResident && !object->copying && object->leases == 0 &&
         object->pins == 0 && object->waiters.empty() && object->host_fetches == 0;
}

void GpuTier::TouchLocked(Object* object) {
  if (object->in_lru) lru_.erase(object->lru_position);
  object->lru_position = lru_.insert(lru_.end(), object);
  object->in_lru = true;
}

void GpuTier::UnlistLocked(Object* object) {
  if (!object->listed) return;
  object->listed = false;
  objects_.erase(object->key);
  if (object->in_lru) {
    lru_.erase(object->lru_position);
    object->in_lru = false;
  }
}

void GpuTier::FreeObjectLocked(Object* object) {
  UnlistLocked(object);
  if (object->range) pool_->Free(*object->range);
  if (object->ready_event) events_.Release(*object->ready_event);
  delete object;
}

void GpuTier::DeleteIfUnusedLocked(Object* object) {
  if (object->listed || object->leases > 0 || object->pins > 0 || object->copying ||
      object->host_fetches > 0 || object->state == Object::State::kAllocating ||
      object->state == Object::State::kFetchingPeer || !object->waiters.empty()) {
    return;
  }
  FreeObjectLocked(object);
}

std::optional<StagingRange> GpuTier::TryAllocateLocked(uint64_t bytes) {
  while (true) {
    if (std::optional<StagingRange> range = pool_->Allocate(bytes)) return range;
    auto victim = std::find_if(lru_.begin(), lru_.end(),
                               [this](Object* object) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                 return IsEvictableLocked(object);
                               });
    if (victim == lru_.end()) return std::nullopt;
    ++stats_.evictions;
    TIERD_VLOG(2) << "GPU tier evicts " << (*victim)->key;
    FreeObjectLocked(*victim);
  }
}

void GpuTier::AllocateLocked(uint64_t bytes,
                             absl::AnyInvocable<void(absl::StatusOr<StagingRange>) &&> done,
                             Deferred& deferred) {
  // Waiters are served in order: a new request does not jump the queue.
  std::optional<StagingRange> range;
  if (allocation_waiters_.empty()) range = TryAllocateLocked(bytes);
  if (range) {
    return DeferAnswer(deferred, std::move(done), absl::StatusOr<StagingRange>(*range));
  }
  if (copies_in_flight_ > 0 || !drains_.empty() || !allocation_waiters_.empty()) {
    allocation_waiters_.push_back({bytes, std::move(done)});
    return;
  }
  DeferAnswer(deferred, std::move(done), PoolExhaustedLocked(bytes));
}

void GpuTier::RetryAllocationsLocked(Deferred& deferred) {
  while (!allocation_waiters_.empty()) {
    AllocationWaiter& waiter = allocation_waiters_.front();
    std::optional<StagingRange> range = TryAllocateLocked(waiter.bytes);
    if (!range) {
      if (copies_in_flight_ > 0 || !drains_.empty()) return;  // more room may come
      DeferAnswer(deferred, std::move(waiter.done), PoolExhaustedLocked(waiter.bytes));
    } else {
      DeferAnswer(deferred, std::move(waiter.done), absl::StatusOr<StagingRange>(*range));
    }
    allocation_waiters_.pop_front();
  }
}

absl::Status GpuTier::PoolExhaustedLocked(uint64_t bytes) const {
  uint64_t leased = 0, pinned = 0;
  for (const auto& [key, object] : objects_) {
    if (!object->range) continue;
    if (object->leases > 0) {
      leased += object->range->size;
    } else if (object->pins > 0) {
      pinned += object->range->size;
    }
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "GPU staging pool full: ", FormatByteSize(bytes), " needed; ",
      FormatByteSize(pool_->used_bytes()), " of ", FormatByteSize(pool_->capacity()), " in use (",
      FormatByteSize(leased), " leased, ", FormatByteSize(pinned),
      " pinned, the rest reserved for stores); release leases or raise --gpu-pool-bytes"));
}

absl::Status GpuTier::CopyInPieces(Stream& stream, uint8_t* dst, const uint8_t* src,
                                   uint64_t bytes) {
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t n = std::min(bytes - done, options_.copy_chunk_bytes);
    RETURN_IF_ERROR(device_.CopyAsync(stream, dst + done, src + done, n));
    done += n;
  }
  return absl::OkStatus();
}

absl::Status GpuTier::CopyChunked(Stream& stream, uint8_t* dst, const uint8_t* src, uint64_t bytes,
                                  bool host_is_dst) {
  const uint8_t* host = host_is_dst ? dst : src;
  const uint64_t piece = arena_.piece_bytes();
  uint64_t done = 0;
  while (done < bytes) {
    const uint64_t arena_offset = static_cast<uint64_t>(host + done - arena_.base());
    const uint64_t to_piece_end = piece - arena_offset % piece;
    const uint64_t n = std::min({bytes - done, options_.copy_chunk_bytes, to_piece_end});
    RETURN_IF_ERROR(device_.CopyAsync(stream, dst + done, src + done, n));
    done += n;
  }
  return absl::OkStatus();
}

}  // namespace tierd
