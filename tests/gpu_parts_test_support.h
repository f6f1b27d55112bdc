// The GPU tier's parts wired as GpuTier wires them — one lock, one TierParts handed to each — on
// the host device over a GpuTestStack, with no facade: the fixture of the tests of one part alone
// (the tests in tests/gpu/ but chunked_copier, client_table, stored_key_space and gpu_tier).
//
//   GpuPartsOptions options;
//   options.pool_bytes = 1 << 20;
//   absl::StatusOr<std::unique_ptr<GpuParts>> parts = GpuParts::Create(options);
//   ExplicitEviction eviction((*parts)->tier(), (*parts)->host_cache(), nullptr,
//                             (*parts)->stored());
//   GpuLoaders loaders(**parts);  // the staging loader and its handoff copies
//   ...
//   (*parts)->AwaitQuiet([&] { return ...the part is idle...; });
//
// Destroy the parts a test made before the GpuParts (their objects' ranges go back to the pool).
#ifndef TIERD_TESTS_GPU_PARTS_TEST_SUPPORT_H_
#define TIERD_TESTS_GPU_PARTS_TEST_SUPPORT_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/liveness.h"
#include "common/timer_thread.h"
#include "gpu/chunked_copier.h"
#include "gpu/detail/client_table.h"
#include "gpu/detail/drain_queue.h"
#include "gpu/detail/handoff_copies.h"
#include "gpu/detail/running_callbacks.h"
#include "gpu/detail/staging_loader.h"
#include "gpu/detail/staging_residency.h"
#include "gpu/detail/stored_key_space.h"
#include "gpu/detail/tier_parts.h"
#include "gpu/event_pool.h"
#include "gpu/gpu_tier_stats.h"
#include "gpu/host_handoff_buffer.h"
#include "gpu/host_source.h"
#include "gpu/staging_pool.h"
#include "tests/gpu_tier_test_support.h"

namespace tierd::testing {

struct GpuPartsOptions {
  int blocks = 1;  // of model "m" (GpuTestStack)
  uint64_t arena_bytes = 4ull << 20;
  uint64_t pool_bytes = 1 << 20;
  uint64_t slab_bytes = 1 << 20;
  uint32_t max_events = 16;
  uint32_t event_batch = 64;
  int max_clients = 2;
  uint64_t copy_chunk_bytes = 16 << 10;
  // Whether drains are pending, as the residency asks; null: the drain queue's own answer.
  std::function<bool()> drains_pending;
};

class GpuParts {
 public:
  static absl::StatusOr<std::unique_ptr<GpuParts>> Create(const GpuPartsOptions& options = {});
  // Lets the timer's pending calls run, marks the tier gone for late completions, and erases the
  // clients left (their drain streams after the lock), then the residency (its ranges back to the
  // pool). REQUIRES: the parts a test made are gone.
  ~GpuParts();
  GpuParts(const GpuParts&) = delete;
  GpuParts& operator=(const GpuParts&) = delete;

  // What each part is made with.
  const TierParts& tier() const { return *tier_; }

  GpuTestStack& stack() { return *stack_; }
  Device& device() { return stack_->device(); }
  Catalog& catalog() { return stack_->catalog(); }
  HostCache& host_cache() { return stack_->host_cache(); }
  StagingPool& pool() { return *pool_; }
  EventPool& events() { return *events_; }
  ClientTable& clients() { return *clients_; }
  StagingResidency& residency() { return *residency_; }
  DrainQueue& drains() { return *drains_; }
  ChunkedCopier& copier() { return *copier_; }
  StoredKeySpace& stored() { return *stored_; }
  RunningCallbacks& callbacks() { return *callbacks_; }
  const std::shared_ptr<Liveness>& liveness() const { return liveness_; }

  // A stream of the device, kept until the parts go. Null on failure (a test failure recorded).
  Stream* NewStream(StreamPriority priority = StreamPriority::kNormal);
  // Opens a client with no done events.
  absl::StatusOr<ClientId> OpenClient() ABSL_LOCKS_EXCLUDED(mu);
  // Waits, under the lock, until `quiet` holds, no callback into the parts is running and no drain
  // is pending, at most `bound`; whether it got there.
  bool AwaitQuiet(
      std::function<bool()> quiet = [] { return true; }, absl::Duration bound = absl::Seconds(10))
      ABSL_LOCKS_EXCLUDED(mu);
  GpuTierStats stats_copy() ABSL_LOCKS_EXCLUDED(mu);

  // The tier's lock, which guards every part and `stats`.
  absl::Mutex mu;
  GpuTierStats stats ABSL_GUARDED_BY(mu);

 private:
  GpuParts() = default;

  std::unique_ptr<GpuTestStack> stack_;
  std::unique_ptr<StagingPool> pool_;
  std::unique_ptr<EventPool> events_;
  std::shared_ptr<Liveness> liveness_ = std::make_shared<Liveness>();
  std::vector<std::unique_ptr<Stream>> streams_;
  std::unique_ptr<ChunkedCopier> copier_;
  std::unique_ptr<StoredKeySpace> stored_;
  std::unique_ptr<RunningCallbacks> callbacks_;
  std::unique_ptr<ClientTable> clients_;
  std::unique_ptr<StagingResidency> residency_;
  std::unique_ptr<TierParts> tier_;
  std::unique_ptr<TimerThread> timer_;
  std::unique_ptr<DrainQueue> drains_;
};

// The staging loader as GpuTier makes it — with its handoff copies, the host cache of `parts` as
// its host source, and streams of its own — for the tests of the loaders alone. Objects read from
// their files are copied to staging as they land (StagingLoader::Own::copy_while_reading) unless
// `copy_while_reading` is false.
class GpuLoaders {
 public:
  // REQUIRES: `parts` outlives this.
  explicit GpuLoaders(GpuParts& parts, uint64_t handoff_buffer_bytes = 1 << 20,
                      bool copy_while_reading = true);
  // Waits (bounded) until no host fetch or copy is in flight and the handoff stream has run.
  ~GpuLoaders();
  GpuLoaders(const GpuLoaders&) = delete;
  GpuLoaders& operator=(const GpuLoaders&) = delete;

  StagingLoader& loader() { return *loader_; }
  HandoffCopies& handoff() { return *handoff_; }
  HostHandoffBuffer& buffer() { return *buffer_; }
  Stream& handoff_stream() { return *handoff_stream_; }

  // Starts (or joins) the load of `key` for `client` as GpuTier::Fetch does for a miss, and waits
  // for the answer.
  absl::StatusOr<LeaseGrant> Fetch(ClientId client, const std::string& key,
                                   bool through_host = false);
  // Loads `key` into staging with no one waiting (a prefetch) and waits until it is resident.
  absl::Status Prefetch(const std::string& key);
  // Waits for `grant`'s ready event (if any); whether its bytes, in staging or in the handoff
  // buffer (host_offset), are `expected`.
  bool Holds(const LeaseGrant& grant, const std::string& expected);

 private:
  GpuParts& parts_;
  std::unique_ptr<HostHandoffBuffer> buffer_;
  LocalHostSource host_source_;
  Stream* demand_stream_;
  Stream* prefetch_stream_;
  Stream* handoff_stream_;
  std::unique_ptr<HandoffCopies> handoff_;
  std::unique_ptr<StagingLoader> loader_;
};

}  // namespace tierd::testing

#endif  // TIERD_TESTS_GPU_PARTS_TEST_SUPPORT_H_
