#include "tests/gpu_parts_test_support.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tierd::testing {

// The parts are wired by reference, as GpuTier's constructor wires them; nothing runs on them
// yet, so no lock is held.
absl::StatusOr<std::unique_ptr<GpuParts>> GpuParts::Create(const GpuPartsOptions& options)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  std::unique_ptr<GpuParts> parts(new GpuParts());
  absl::StatusOr<std::unique_ptr<GpuTestStack>> stack = GpuTestStack::Create(options.blocks, nullptr, {}, options.arena_bytes);
  if (!stack.ok()) return stack.status();
  parts->stack_ = *std::move(stack);
  Device& device = parts->device();
  absl::StatusOr<std::unique_ptr<StagingPool>> pool =
      StagingPool::Create(device, options.pool_bytes, options.slab_bytes);
  if (!pool.ok()) return pool.status();
  parts->pool_ = *std::move(pool);
  parts->events_ = std::make_unique<EventPool>(device, options.max_events, options.event_batch);
  parts->copier_ =
      std::make_unique<ChunkedCopier>(device, parts->stack_->arena(), options.copy_chunk_bytes);
  parts->stored_ = std::make_unique<StoredKeySpace>(parts->catalog(), "");
  parts->callbacks_ = std::make_unique<RunningCallbacks>(parts->mu);
  parts->clients_ = std::make_unique<ClientTable>(parts->mu, device, options.max_clients);
  GpuParts* self = parts.get();
  std::function<bool()> drains_pending = options.drains_pending;
  if (!drains_pending) {
    drains_pending = [self]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return self->drains_->pending(); };
  }
  parts->residency_ = std::make_unique<StagingResidency>(
      parts->mu, device, parts->catalog(), *parts->pool_, *parts->events_, parts->stats,
      parts->liveness_, std::move(drains_pending));
  parts->tier_ = std::make_unique<TierParts>(
      TierParts{parts->mu, device, parts->catalog(), *parts->pool_, *parts->events_,
                *parts->copier_, *parts->residency_, *parts->callbacks_, parts->stats});
  parts->timer_ = std::make_unique<TimerThread>();
  parts->drains_ =
      std::make_unique<DrainQueue>(parts->mu, device, *parts->events_, *parts->clients_,
                                   *parts->residency_, *parts->timer_, parts->liveness_);
  return parts;
}

GpuParts::~GpuParts() {
  if (drains_ == nullptr) return;  // Create failed part-way
  EXPECT_TRUE(AwaitQuiet());
  for (const auto& stream : streams_) {
    EXPECT_TRUE(device().SynchronizeStream(*stream).ok());
  }
  // The timer's pending calls run before the rest goes; late completions find the parts gone.
  timer_.reset();
  liveness_->MarkGone();
  std::vector<std::unique_ptr<GpuClient>> clients;
  {
    absl::MutexLock lock(&mu);
    for (ClientId id : clients_->Ids()) clients.push_back(clients_->Erase(id));
  }
  clients.clear();  // their drain streams go after the lock, as the tier's do
  drains_.reset();
  residency_.reset();  // its objects' ranges go back to the pool, which outlives it
}

Stream* GpuParts::NewStream(StreamPriority priority) {
  absl::StatusOr<std::unique_ptr<Stream>> stream = device().CreateStream(priority);
  EXPECT_TRUE(stream.ok()) << stream.status();
  if (!stream.ok()) return nullptr;
  streams_.push_back(*std::move(stream));
  return streams_.back().get();
}

absl::StatusOr<ClientId> GpuParts::OpenClient() { return clients_->Open({}, {}); }

bool GpuParts::AwaitQuiet(std::function<bool()> quiet, absl::Duration bound) {
  absl::MutexLock lock(&mu);
  struct Check {
    GpuParts* parts;
    std::function<bool()>* quiet;
  } check{this, &quiet};
  return mu.AwaitWithTimeout(absl::Condition(
                                 +[](Check* c) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                   return (*c->quiet)() && c->parts->callbacks_->none() &&
                                          !c->parts->drains_->pending();
                                 },
                                 &check),
                             bound);
}

GpuTierStats GpuParts::stats_copy() {
  absl::MutexLock lock(&mu);
  return stats;
}

GpuLoaders::GpuLoaders(GpuParts& parts, uint64_t handoff_buffer_bytes, bool copy_while_reading)
    : parts_(parts),
      buffer_(std::make_unique<HostHandoffBuffer>(parts.device(), handoff_buffer_bytes)),
      host_source_(parts.host_cache(), parts.stack().arena()),
      demand_stream_(parts.NewStream(StreamPriority::kHigh)),
      prefetch_stream_(parts.NewStream()),
      handoff_stream_(parts.NewStream()) {
  handoff_ =
      std::make_unique<HandoffCopies>(parts.tier(), *handoff_stream_, *buffer_, parts.liveness());
  loader_ = std::make_unique<StagingLoader>(
      parts.tier(), StagingLoader::Own{host_source_, *demand_stream_, *prefetch_stream_,
                                       parts.clients(), *handoff_, parts.stored(),
                                       /*check_decodes_before_serving=*/true,
                                       /*decode_scratch_bytes=*/0, copy_while_reading});
}

GpuLoaders::~GpuLoaders() {
  EXPECT_TRUE(parts_.AwaitQuiet([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return loader_->host_fetches_in_flight() == 0 && parts_.residency().copies_in_flight() == 0;
  }));
  EXPECT_TRUE(parts_.device().SynchronizeStream(*handoff_stream_).ok());
  loader_.reset();
  handoff_.reset();
  buffer_.reset();
}

absl::StatusOr<LeaseGrant> GpuLoaders::Fetch(ClientId client_id, const std::string& key,
                                             bool through_host) {
  Answer<absl::StatusOr<LeaseGrant>> answer;
  {
    DeferredCalls deferred;
    absl::MutexLock lock(&parts_.mu);
    GpuClient* client = parts_.clients().Find(client_id);
    if (client == nullptr) return absl::NotFoundError("no such client");
    StagingObject* object = parts_.residency().FindListed(key);
    if (object != nullptr && object->state == StagingObject::State::kResident) {
      return loader_->Grant(*client, object, through_host);
    }
    if (object == nullptr) {
      absl::StatusOr<StagingObject*> started =
          loader_->StartLoad(key, ReadPriority::kDemand, absl::InfiniteFuture(), deferred.calls());
      if (!started.ok()) return started.status();
      object = *started;
    }
    ++client->pending_fetches;
    object->waiters.push_back({client_id, answer.Callback(), nullptr, through_host});
  }
  return answer.Wait();
}

absl::Status GpuLoaders::Prefetch(const std::string& key) {
  {
    DeferredCalls deferred;
    absl::MutexLock lock(&parts_.mu);
    absl::StatusOr<StagingObject*> started =
        loader_->StartLoad(key, ReadPriority::kPrefetch, absl::InfiniteFuture(), deferred.calls());
    if (!started.ok()) return started.status();
  }
  if (!parts_.AwaitQuiet([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        const StagingObject* object = parts_.residency().FindListed(key);
        return object == nullptr ||
               (object->state == StagingObject::State::kResident && !object->copying);
      })) {
    return absl::DeadlineExceededError(absl::StrCat("prefetching ", key));
  }
  absl::MutexLock lock(&parts_.mu);
  if (parts_.residency().FindListed(key) == nullptr) {
    return absl::UnavailableError(absl::StrCat(key, " failed to load"));
  }
  return absl::OkStatus();
}

bool GpuLoaders::Holds(const LeaseGrant& grant, const std::string& expected) {
  if (grant.ready_event) {
    EXPECT_TRUE(parts_.device().SynchronizeEvent(parts_.events().event(*grant.ready_event)).ok());
  }
  const uint8_t* bytes = grant.host_offset
                             ? buffer_->data() + *grant.host_offset
                             : static_cast<const uint8_t*>(parts_.pool().data(grant.range));
  return grant.length == expected.size() &&
         std::memcmp(bytes, expected.data(), expected.size()) == 0;
}

}  // namespace tierd::testing
