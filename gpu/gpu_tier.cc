// GpuTier, the facade: builds the parts (gpu/detail/) and routes each request to the ones it
// concerns, under the tier's lock. What each part does is said in its header.
#include "gpu/gpu_tier.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/deferred_calls.h"
#include "common/leak_on_purpose.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace tierd {

absl::StatusOr<std::unique_ptr<GpuTier>> GpuTier::Create(Device& device, Catalog& catalog,
                                                         HostArena& arena, HostCache& host_cache,
                                                         const GpuTierOptions& options) {
  if (options.copy_chunk_bytes == 0) {
    return absl::InvalidArgumentError("the copy chunk size must be greater than 0");
  }
  if (options.decode_scratch_bytes < CompressedCopies::kMinScratchBytes ||
      options.decode_scratch_bytes % (1 << 20) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the decode scratch area must be a whole number of MiB from ",
                     FormatByteSize(CompressedCopies::kMinScratchBytes), ", not ",
                     options.decode_scratch_bytes, " bytes"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<StagingPool> pool,
                   StagingPool::Create(device, options.pool_bytes, options.slab_bytes));
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> demand, device.CreateStream(StreamPriority::kHigh));
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> prefetch, device.CreateStream(StreamPriority::kNormal));
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> store, device.CreateStream(StreamPriority::kNormal));
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> handoff, device.CreateStream(StreamPriority::kHigh));
  std::unique_ptr<GpuTier> tier(new GpuTier(device, catalog, arena, host_cache, options,
                                            std::move(pool), std::move(demand), std::move(prefetch),
                                            std::move(store), std::move(handoff)));
  RETURN_IF_ERROR(tier->events_.Prefill());
  ASSIGN_OR_RETURN(tier->retained_,
                   RetainedSets::Create(*tier, catalog,
                                        {.budget_bytes = options.retained_budget_bytes,
                                         .state_file = options.retained_state_file}));
  return tier;
}

GpuTier::GpuTier(Device& device, Catalog& catalog, HostArena& arena, HostCache& host_cache,
                 const GpuTierOptions& options, std::unique_ptr<StagingPool> pool,
                 std::unique_ptr<Stream> demand_stream, std::unique_ptr<Stream> prefetch_stream,
                 std::unique_ptr<Stream> store_stream, std::unique_ptr<Stream> handoff_stream)
    : device_(device),
      catalog_(catalog),
      options_(options),
      local_host_source_(host_cache, arena),
      host_source_(options.host_source != nullptr ? *options.host_source : local_host_source_),
      pool_(std::move(pool)),
      events_(device, options.max_events),
      handoff_buffer_(std::make_unique<HostHandoffBuffer>(device, options.handoff_buffer_bytes)),
      demand_stream_(std::move(demand_stream)),
      prefetch_stream_(std::move(prefetch_stream)),
      store_stream_(std::move(store_stream)),
      handoff_stream_(std::move(handoff_stream)),
      liveness_(std::make_shared<Liveness>()),
      copier_(device, arena, options.copy_chunk_bytes),
      stored_(catalog, options.stored_key_prefix),
      callbacks_(mu_),
      clients_(mu_, device, options.max_clients),
      residency_(mu_, device, catalog, *pool_, events_, stats_, liveness_,
                 [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return drains_.pending(); }),
      parts_{mu_, device, catalog, *pool_, events_, copier_, residency_, callbacks_, stats_},
      handoff_(parts_, *handoff_stream_, *handoff_buffer_, liveness_),
      drains_(mu_, device, events_, clients_, residency_, timer_, liveness_),
      loader_(parts_,
              {host_source_, *demand_stream_, *prefetch_stream_, clients_, handoff_, stored_,
               options.check_decodes_before_serving, options.decode_scratch_bytes,
               options.copy_while_reading}),
      peer_loader_(parts_, {options.peers, *handoff_stream_, loader_}),
      commits_(parts_,
               {host_cache, options.durable_store, *store_stream_, clients_, drains_, stored_}),
      eviction_(parts_, host_cache, options.durable_store, stored_) {}

GpuTier::~GpuTier() {
  retained_.reset();  // its sweeps call the tier; its client is closed below with the rest
  std::vector<ClientId> open;
  {
    absl::MutexLock lock(&mu_);
    open = clients_.Ids();
  }
  for (ClientId id : open) CloseClient(id);
  {
    // Closed clients' drains (their done events, which may never have been recorded) get their
    // close grace, as they would have had without the tier going; then what is left is forced.
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(
        absl::Condition(
            +[](DrainQueue* drains) ABSL_NO_THREAD_SAFETY_ANALYSIS { return !drains->pending(); },
            &drains_),
        options_.close_grace);
  }
  for (ClientId id : open) ForceClose(id);
  {
    // Copies, commits and host and peer fetches in flight call back into the tier; wait for them,
    // and for the callbacks still running the calls they deferred past the lock.
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](GpuTier* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return self->residency_.copies_in_flight() == 0 &&
                 self->loader_.host_fetches_in_flight() == 0 && self->callbacks_.none() &&
                 self->peer_loader_.in_flight() == 0 && self->commits_.idle();
        },
        this));
  }
  if (handoff_buffer_->allocated()) {
    // Copies into the handoff buffer for peers may still run: the buffer is unregistered below.
    if (absl::Status idle = device_.SynchronizeStream(*handoff_stream_); !idle.ok()) {
      TIERD_LOG(WARNING) << "waiting for the handoff stream: " << idle;
    }
  }
  liveness_->MarkGone();
  // The objects left go with the residency, their ranges back to the pool, which outlives it.
  absl::MutexLock lock(&mu_);
  if (const uint64_t abandoned = drains_.abandoned_waits(); abandoned > 0) {
    // Freeing device memory waits for every stream of the device, among them drain streams
    // waiting on events that dead clients will never record. The process's exit frees it instead.
    TIERD_LOG(WARNING) << abandoned
                       << " wait(s) on events of clients that died with work queued may never "
                          "complete; the staging pool is left to the process's exit";
    LeakOnPurpose(pool_);
  }
}

// ---- Clients ------------------------------------------------------------------------------------

absl::StatusOr<ClientId> GpuTier::OpenClient(const ClientLimits& limits) {
  std::vector<uint32_t> done_events;
  const uint32_t wanted = limits.done_events.value_or(options_.done_events_per_client);
  for (uint32_t i = 0; i < wanted; ++i) {
    absl::StatusOr<uint32_t> event = events_.Acquire(EventUse::kClientRecords);
    if (!event.ok()) break;  // counted as a shortfall; the client waits on its CPU instead
    done_events.push_back(*event);
  }
  absl::StatusOr<ClientId> opened = clients_.Open(limits, done_events);
  if (!opened.ok()) {
    // Never recorded: nobody can wait on them.
    for (uint32_t event : done_events) events_.Release(event);
  }
  return opened;
}

std::vector<uint32_t> GpuTier::DoneEvents(ClientId id) const {
  absl::MutexLock lock(&mu_);
  const GpuClient* client = clients_.FindAny(id);
  return client == nullptr ? std::vector<uint32_t>{} : client->done_events;
}

ClosedClient GpuTier::CloseClient(ClientId id) {
  DeferredCalls deferred;
  std::shared_ptr<Stream> stream_to_destroy;
  absl::MutexLock lock(&mu_);
  GpuClient* client = clients_.Find(id);
  if (client == nullptr) return {};
  client->closed = true;
  const ClosedClient freed{client->leases.size(), client->reservations.size(), client->pins.size()};
  // The client may have recorded any of its done events after its last use of a lease it did not
  // release, or its last write into a reservation: what it held is freed once all of them have
  // completed, and so are copies into the host handoff buffer for it. Then the events go back to
  // the pool (or are retired, when the grace runs out first).
  std::vector<uint32_t> events = client->done_events;
  std::vector<GpuClient::Lease> leases;
  for (auto& [lease_id, lease] : client->leases) {
    if (lease.host_ready_event) events.push_back(*lease.host_ready_event);
    leases.push_back(std::move(lease));
  }
  client->leases.clear();
  std::vector<GpuClient::Reservation> reservations;
  for (auto& [reservation_id, reservation] : client->reservations) {
    reservations.push_back(std::move(reservation));
  }
  client->reservations.clear();
  drains_.Start(
      *client, events, events,
      [this, leases = std::move(leases), reservations = std::move(reservations)](
          bool forced, DrainQueue::Deferred&) ABSL_NO_THREAD_SAFETY_ANALYSIS mutable {
        // Runs under the tier's lock.
        for (const GpuClient::Lease& lease : leases) LeaseDrained(lease, forced);
        for (GpuClient::Reservation& reservation : reservations) {
          commits_.Abandoned(std::move(reservation));
        }
      },
      deferred.calls());
  client->done_events.clear();
  for (auto& [key, pin] : client->pins) {
    pin.object->pins -= pin.count;
    stats_.pins -= pin.count;
    residency_.TouchOrFreeIfUnused(pin.object);
  }
  client->pins.clear();
  client->staging_bytes = 0;
  if (client->drains.empty()) {
    stream_to_destroy = std::move(client->drain_stream);
    clients_.Erase(id);
  } else {
    timer_.RunAfter(options_.close_grace, [this, id] { ForceClose(id); });
  }
  residency_.RetryAllocations(deferred.calls());
  // The stream goes after the lock: destroying it may run drain callbacks, which take it.
  deferred.calls().push_back([stream = std::move(stream_to_destroy)]() mutable { stream.reset(); });
  return freed;
}

void GpuTier::ForceClose(ClientId id) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  GpuClient* client = clients_.FindAny(id);
  if (client == nullptr) return;
  if (!client->drains.empty()) {
    TIERD_LOG(WARNING) << "session " << id << ": " << client->drains.size()
                       << " release(s) still waiting for the client's done event after "
                       << absl::FormatDuration(options_.close_grace)
                       << "; the client is gone, freeing them";
  }
  const std::set<uint64_t> drains = client->drains;
  for (uint64_t drain : drains) drains_.Finish(drain, /*forced=*/true, deferred.calls());
  deferred.calls().push_back(
      [stream = std::move(client->drain_stream)]() mutable { stream.reset(); });
  clients_.Erase(id);
}

void GpuTier::DrainLeaseLocked(GpuClient& client, const GpuClient::Lease& lease,
                               std::optional<uint32_t> done_event, DrainQueue::Deferred& deferred) {
  std::vector<uint32_t> wait_on, owned;
  if (done_event) wait_on.push_back(*done_event);
  if (lease.host_ready_event) {
    // The copy into the handoff buffer must be over too; the event is the lease's own.
    wait_on.push_back(*lease.host_ready_event);
    owned.push_back(*lease.host_ready_event);
  }
  drains_.Start(
      client, std::move(wait_on), std::move(owned),
      [this, lease](bool forced, DrainQueue::Deferred&)
          ABSL_NO_THREAD_SAFETY_ANALYSIS { LeaseDrained(lease, forced); },
      deferred);
}

void GpuTier::LeaseDrained(const GpuClient::Lease& lease, bool forced) {
  mu_.AssertHeld();
  StagingObject* object = lease.object;
  if (lease.host_offset.has_value()) {
    // A forced drain's event says nothing: the copy into the range may still be queued.
    if (forced) {
      handoff_.FreeLater(*lease.host_offset, object->size);
    } else {
      handoff_.Free(*lease.host_offset, object->size);
    }
  }
  --object->refs;
  --stats_.leases;
  object->last_released = absl::Now();
  if (lease.names_ready_event) {
    --object->ready_event_leases;
    residency_.DropReadyEventIfUnneeded(object);
  }
  residency_.TouchOrFreeIfUnused(object);
}

// ---- Leases -------------------------------------------------------------------------------------

void GpuTier::DeriveShardLayout(const std::string& key) const {
  if (key.find('@') != std::string::npos) (void)catalog_.Lookup(key);
}

StagingObject* GpuTier::ListedServable(const std::string& key) {
  StagingObject* object = residency_.FindListed(key);
  if (object == nullptr || object->model != nullptr || object->copying ||
      !catalog_.InModelNamespace(key)) {
    return object;
  }
  // A stored object under a key that names a model's weights now (stored before the model was
  // registered): never served for them. Holders keep their bytes until they release them.
  stored_.Remove(key);
  residency_.Remove(object);
  return nullptr;
}

void GpuTier::Fetch(ClientId client_id, const std::string& key, ReadPriority priority,
                    absl::Time deadline, LeaseCallback done, FetchOptions options) {
  DeriveShardLayout(key);
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  auto fail = [&](absl::Status status) { DeferAnswer(deferred.calls(), std::move(done), status); };
  GpuClient* client = clients_.Find(client_id);
  if (client == nullptr) return fail(ClientGone());
  if (absl::Status quota = client->CheckLeaseQuota(); !quota.ok()) return fail(quota);
  StagingObject* object = ListedServable(key);
  if (object != nullptr && object->state == StagingObject::State::kResident) {
    ++stats_.hits;
    residency_.Touch(object);
    return DeferAnswer(deferred.calls(), std::move(done),
                       loader_.Grant(*client, object, options.through_host));
  }
  ++stats_.misses;
  if (object == nullptr) {
    absl::StatusOr<StagingObject*> started =
        loader_.StartLoad(key, priority, deadline, deferred.calls());
    if (absl::IsNotFound(started.status()) && options.ask_peers && options_.peers != nullptr) {
      return peer_loader_.Start(*client, key, std::move(done), deferred.calls());
    }
    if (!started.ok()) return fail(started.status());
    object = *started;
  } else if (priority == ReadPriority::kDemand && !object->demand) {
    // Promote the host read; whichever answer comes first is used.
    loader_.Promote(object, deadline, deferred.calls());
  }
  ++client->pending_fetches;
  object->waiters.push_back({client_id, std::move(done), nullptr, options.through_host});
}

absl::Status GpuTier::Release(ClientId client_id, uint64_t lease_id,
                              std::optional<uint32_t> done_event) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  GpuClient* client = clients_.Find(client_id);
  if (client == nullptr) return ClientGone();
  if (done_event) RETURN_IF_ERROR(client->CheckDoneEvent(*done_event));
  ASSIGN_OR_RETURN(const GpuClient::Lease lease, clients_.TakeLease(*client, lease_id));
  DrainLeaseLocked(*client, lease, done_event, deferred.calls());
  return absl::OkStatus();
}

// ---- Residency controls -------------------------------------------------------------------------

absl::StatusOr<bool> GpuTier::Prefetch(const std::string& key, absl::Time deadline,
                                       bool host_only) {
  if (host_only) {
    ASSIGN_OR_RETURN(const std::string host_key, stored_.OwnHostKey(key));
    const bool resident = host_source_.IsResident(host_key);
    RETURN_IF_ERROR(host_source_.Prefetch(host_key, deadline));
    return !resident;
  }
  DeriveShardLayout(key);
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  if (StagingObject* object = ListedServable(key); object != nullptr) {
    residency_.Touch(object);
    return false;
  }
  RETURN_IF_ERROR(
      loader_.StartLoad(key, ReadPriority::kPrefetch, deadline, deferred.calls()).status());
  return true;
}

void GpuTier::Pin(ClientId client_id, const std::string& key, StatusCallback done) {
  DeriveShardLayout(key);
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  auto answer = [&](absl::Status status) {
    DeferAnswer(deferred.calls(), std::move(done), status);
  };
  GpuClient* client = clients_.Find(client_id);
  if (client == nullptr) return answer(ClientGone());
  StagingObject* object = ListedServable(key);
  if (absl::Status same = client->CheckPinnedVersion(key, object); !same.ok()) {
    return answer(same);
  }
  if (object == nullptr) {
    absl::StatusOr<StagingObject*> started =
        loader_.StartLoad(key, ReadPriority::kDemand, absl::InfiniteFuture(), deferred.calls());
    if (!started.ok()) return answer(started.status());
    object = *started;
  }
  if (absl::Status pinned = clients_.AddPin(*client, object); !pinned.ok()) {
    residency_.FreeIfUnused(object);
    return answer(pinned);
  }
  ++stats_.pins;
  if (object->state == StagingObject::State::kResident) {
    residency_.Touch(object);
    return answer(absl::OkStatus());
  }
  object->waiters.push_back({client_id, nullptr, std::move(done)});
}

absl::Status GpuTier::Unpin(ClientId client_id, const std::string& key) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  GpuClient* client = clients_.Find(client_id);
  if (client == nullptr) return ClientGone();
  if (client->pins.count(key) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(key, " is not pinned by this session"));
  }
  StagingObject* object = clients_.DropPin(*client, key);
  --stats_.pins;
  residency_.TouchOrFreeIfUnused(object);
  residency_.RetryAllocations(deferred.calls());
  return absl::OkStatus();
}

absl::StatusOr<EvictResult> GpuTier::Evict(const std::string& key_or_prefix, EvictTier tier) {
  return eviction_.Evict(key_or_prefix, tier);
}

void GpuTier::ForgetModel(const std::string& model) { eviction_.ForgetModel(model); }

size_t GpuTier::ForgetStoredUnder(const std::string& model) {
  return eviction_.ForgetStoredUnder(model);
}

// ---- Stores -------------------------------------------------------------------------------------

void GpuTier::Reserve(ClientId client, const std::string& key, uint64_t length,
                      std::vector<TensorPlacement> tensors, StorePolicy policy,
                      ReserveCallback done) {
  commits_.Reserve(client, key, length, std::move(tensors), policy, std::move(done));
}

void GpuTier::AdoptStored(const std::string& key, uint64_t size,
                          std::vector<TensorPlacement> tensors) {
  stored_.Publish(key,
                  {size, std::make_shared<const std::vector<TensorPlacement>>(std::move(tensors))});
}

void GpuTier::Commit(ClientId client, uint64_t reservation_id, bool abort,
                     std::optional<uint32_t> written_event, StatusCallback done) {
  commits_.Commit(client, reservation_id, abort, written_event, std::move(done));
}

// ---- What it reports ----------------------------------------------------------------------------

bool GpuTier::IsOnGpu(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  const StagingObject* object = residency_.Listed(key);
  return object != nullptr && object->state == StagingObject::State::kResident;
}

std::optional<GpuObjectUse> GpuTier::ObjectUse(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  const StagingObject* object = residency_.Listed(key);
  if (object == nullptr) return std::nullopt;
  GpuObjectUse use;
  use.resident = object->state == StagingObject::State::kResident ||
                 object->state == StagingObject::State::kCopying;
  if (object->memory.has_value()) use.range = object->memory->range();
  use.leases = object->refs;
  use.pins = object->pins;
  use.copying = object->copying;
  use.last_released = object->last_released;
  return use;
}

void GpuTier::PreferPlacement(const std::string& key, const StagingRange& range) {
  absl::MutexLock lock(&mu_);
  residency_.PreferPlacement(key, range);
}

void GpuTier::ForgetPreferredPlacement(const std::string& key) {
  absl::MutexLock lock(&mu_);
  residency_.ForgetPreferredPlacement(key);
}

absl::StatusOr<uint64_t> GpuTier::ObjectSize(const std::string& key) const {
  if (catalog_.InModelNamespace(key)) {
    ASSIGN_OR_RETURN(const ObjectRef object, catalog_.Lookup(key));
    return object.object->size;
  }
  std::optional<StoredKeySpace::Meta> stored = stored_.Find(key);
  if (!stored.has_value()) return absl::NotFoundError(absl::StrCat("no stored object ", key));
  return stored->size;
}

GpuTierStats GpuTier::stats() const {
  absl::MutexLock lock(&mu_);
  GpuTierStats stats = stats_;
  stats.budget_bytes = pool_->capacity();
  stats.used_bytes = pool_->used_bytes();
  stats.objects = residency_.listed_count();
  stats.copies_in_flight = residency_.copies_in_flight();
  stats.allocation_waiters = residency_.allocation_waiters();
  stats.clients = clients_.OpenCount();
  stats.slabs = pool_->slab_count();
  return stats;
}

bool GpuTier::device_may_never_idle() const {
  absl::MutexLock lock(&mu_);
  return drains_.abandoned_waits() > 0;
}

HandleList GpuTier::Handles() const { return {pool_->Slabs(), events_.Events()}; }

}  // namespace tierd
