// The values GpuTier's interface speaks in: its options, the limits and holdings of a client, and
// the grants it answers with. Apart from gpu/gpu_tier.h so that the tier's parts (gpu/detail/) use
// them without the facade.
#ifndef TIERD_GPU_GPU_TIER_TYPES_H_
#define TIERD_GPU_GPU_TIER_TYPES_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpu/event_pool.h"
#include "gpu/host_source.h"
#include "gpu/peer_source.h"
#include "gpu/staging_pool.h"
#include "storage/host/durable_store.h"
#include "storage/model/catalog.h"

namespace tierd {

struct GpuTierOptions {
  uint64_t pool_bytes = 0;
  uint64_t slab_bytes = 2ull << 30;
  // The tier's interprocess events (a pool of its own: its sessions are handed their handles, and
  // no other tier's); the daemon gives each tier a share of --max-events.
  uint32_t max_events = 2048;
  // Done events each client (session) is given when it opens (fewer when the pool is short): it
  // records one after its last use of a lease, or its last write into a reservation, and names it
  // in Release or Commit.
  uint32_t done_events_per_client = 4;
  // Host ↔ staging copies are issued in pieces of at most this, so a demand copy on the other
  // stream is not stuck behind one huge copy.
  uint64_t copy_chunk_bytes = 64ull << 20;
  absl::Duration close_grace = absl::Seconds(1);
  // Sessions open at once (each has a stream of its own); OpenClient refuses one more.
  uint32_t max_clients = 1024;
  // Where durable stored objects go; null: durable reservations are refused (FAILED_PRECONDITION).
  // Must outlive the tier.
  DurableStore* durable_store = nullptr;
  // Prefixed to the keys of this tier's stored objects in the host cache and the durable store,
  // which tiers share: a client group's tier (server/client_groups.h) keeps its
  // stored objects apart from every other tier's, and such a tier serves, prefetches and evicts
  // only its own stored objects and model weights. Empty for the daemon's default tier.
  std::string stored_key_prefix;
  // Retained sets (gpu/retained_sets.h): the staging bytes they may hold (0: none may be retained),
  // and the file that records them so that they come back after a restart (empty: not recorded).
  uint64_t retained_budget_bytes = 0;
  std::string retained_state_file;
  // Where fetches of stored objects this tier does not have look next: the node's other daemons.
  // Null: nowhere (NOT_FOUND). Must outlive the tier.
  PeerSource* peers = nullptr;
  // Where loads find objects' bytes in host memory: null for the daemon's own host cache; on a node
  // of daemons, the node's host tier (server/node/node_host_tier.h). Must outlive the tier.
  HostSource* host_source = nullptr;
  // The pinned host memory objects are copied through for peers that cannot read this GPU's
  // memory (FetchOptions::through_host); allocated on first use.
  uint64_t handoff_buffer_bytes = 256ull << 20;
  // Objects held compressed in host memory: true answers their fetches once the decode on the GPU
  // is known to match its checksums (a decode that does not is DATA_LOSS, never leased); false
  // answers them as soon as the decode is enqueued, with a ready event after it, as raw copies are
  // answered, so that a client can queue its work ahead — a decode that then fails its check is
  // counted and its object dropped, but leases already granted were given its bytes.
  bool check_decodes_before_serving = true;
  // Objects read from local files into the host tier are copied to staging as their segments land
  // (gpu/detail/landed_copies.h), not once the whole object is read; served only once checked
  // either way. Off by default: measured on an H100 it was slower (docs/BENCHMARKS.md; the likely
  // cause, not measured apart: the reader threads enqueue the copies themselves).
  bool copy_while_reading = false;
  // Device memory each copy stream decodes compressed objects through, allocated on first use:
  // what its copies may run ahead of its decodes (gpu/detail/compressed_copies.h). At least
  // CompressedCopies::kMinScratchBytes (56 MiB), a multiple of 1 MiB.
  uint64_t decode_scratch_bytes = 1ull << 30;
};

// How a stored object is kept (ReserveRequest's flags).
struct StorePolicy {
  bool spillable = false;  // may go to the spill directory under host-memory pressure
  // Written and fsynced to the durable store before its commit is acknowledged; survives a restart
  // of the daemon. A durable object does not spill: its durable copy serves instead.
  bool durable = false;
};

struct ClientLimits {
  uint32_t max_leases = 4096;
  uint64_t max_staging_bytes = ~0ull;  // leased + reserved + pinned bytes
  // Done events the client is given; nullopt: GpuTierOptions::done_events_per_client. A client of
  // the daemon's own that only pins (the retained sets') takes none.
  std::optional<uint32_t> done_events;
  // A client of the daemon's own (the retained sets'), not a session: neither counted against
  // GpuTierOptions::max_clients nor among the open clients the stats report.
  bool daemons_own = false;
};

// How an object in staging is used now (GpuTier::ObjectUse).
struct GpuObjectUse {
  bool resident = false;  // its copy into staging is enqueued or done
  StagingRange range;     // where it lies; size 0 while it has no room yet
  uint32_t leases = 0;
  uint32_t pins = 0;
  bool copying = false;  // a copy into or out of its range has not been seen complete yet
  absl::Time last_released = absl::InfinitePast();  // when its last lease ended
};

using ClientId = uint64_t;
using Tensors = std::shared_ptr<const std::vector<TensorPlacement>>;

struct LeaseGrant {
  uint64_t lease_id = 0;
  std::string key;
  StagingRange range;
  uint64_t length = 0;
  // Wait on it before reading; none when the bytes are in staging already. Never recorded again
  // while the lease is held.
  std::optional<uint32_t> ready_event;
  Tensors tensors;
  // FetchOptions::through_host: where the bytes are in the host handoff buffer.
  std::optional<uint64_t> host_offset;
};

struct ReservationGrant {
  uint64_t reservation_id = 0;
  std::string key;
  StagingRange range;
  uint64_t length = 0;
};

enum class EvictTier { kGpu, kHost, kAll };

struct EvictResult {
  uint32_t evicted = 0;
  uint32_t skipped = 0;
};

// How a fetch is answered (FetchRequest's flags).
struct FetchOptions {
  // Where a key this tier (and the host tier and disk behind it) does not know is looked for
  // next: GpuTierOptions::peers, or nowhere (NOT_FOUND).
  bool ask_peers = false;
  // Also copy the object into the host handoff buffer and answer with its range there; the
  // lease's ready event is then one the tier records after that copy, held until the lease is
  // released. For a peer daemon whose GPU cannot read this one's memory.
  bool through_host = false;
};

// What a client still held when it was closed.
struct ClosedClient {
  size_t leases = 0;
  size_t reservations = 0;
  size_t pins = 0;  // distinct keys pinned
};

struct HandleList {
  std::vector<StagingSlabInfo> slabs;
  std::vector<EventInfo> events;
};

using GpuLeaseCallback = absl::AnyInvocable<void(absl::StatusOr<LeaseGrant>) &&>;
using GpuReserveCallback = absl::AnyInvocable<void(absl::StatusOr<ReservationGrant>) &&>;
using GpuStatusCallback = absl::AnyInvocable<void(absl::Status) &&>;

}  // namespace tierd

#endif  // TIERD_GPU_GPU_TIER_TYPES_H_
