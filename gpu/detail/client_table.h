// The GPU tier's clients (sessions): what each holds — leases, reservations, pins — and the quotas
// that bound it, from OpenClient to the moment the last of its drains is done.
//
// Internal to the GPU tier. Its state is guarded by the tier's lock: leases and pins point at
// staging objects (staging_object.h), whose eviction depends on them. Methods say REQUIRES: the
// tier's lock when it must be held.
#ifndef TIERD_GPU_DETAIL_CLIENT_TABLE_H_
#define TIERD_GPU_DETAIL_CLIENT_TABLE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "device/device.h"
#include "gpu/detail/staging_object.h"
#include "gpu/gpu_tier_types.h"

namespace tierd {

// UNAVAILABLE: the client's session has ended.
absl::Status ClientGone();
// RESOURCE_EXHAUSTED: an object of `bytes` cannot fit in a staging slab of `slab_bytes`.
absl::Status LargerThanSlab(const std::string& key, uint64_t bytes, uint64_t slab_bytes);

struct GpuClient {
  struct Lease {
    StagingObject* object = nullptr;
    bool names_ready_event = false;  // granted with the object's ready event
    // FetchOptions::through_host: its range in the host handoff buffer, and the event the tier
    // recorded after the copy into it (the lease's own).
    std::optional<uint64_t> host_offset;
    std::optional<uint32_t> host_ready_event;
  };
  struct Reservation {
    std::string key;
    StagingAllocation range;  // freed with the reservation unless a commit takes it
    uint64_t length = 0;
    Tensors tensors;
    StorePolicy policy;
  };
  struct PinRecord {
    StagingObject* object = nullptr;
    int count = 0;
  };

  // OK when the client, holding staging_bytes, may take `bytes` more for `key`.
  absl::Status CheckStagingQuota(const std::string& key, uint64_t bytes) const;
  // OK when the client may start one more fetch.
  absl::Status CheckLeaseQuota() const;
  // FAILED_PRECONDITION when the client pinned a version of `key` other than `listed` (the
  // object listed under it now, or nullptr).
  absl::Status CheckPinnedVersion(const std::string& key, const StagingObject* listed) const;
  // INVALID_ARGUMENT unless `event` is one of the client's done events.
  absl::Status CheckDoneEvent(uint32_t event) const;

  ClientId id = 0;
  ClientLimits limits;
  std::shared_ptr<Stream> drain_stream;
  // The events it records after its last use of a lease or write into a reservation (their ids
  // in the tier's EventPool); back to the pool once the client is closed and they have completed.
  std::vector<uint32_t> done_events;
  std::map<uint64_t, Lease> leases;
  uint64_t next_lease = 1;
  std::map<uint64_t, Reservation> reservations;
  uint64_t next_reservation = 1;
  std::map<std::string, PinRecord> pins;
  uint32_t pending_fetches = 0;
  uint64_t staging_bytes = 0;  // leased + reserved + pinned
  std::set<uint64_t> drains;   // its drains in flight (drain_queue.h)
  bool closed = false;
};

class ClientTable {
 public:
  // `tier_mu` guards the table; `device` makes the clients' drain streams. Both must outlive it.
  ClientTable(absl::Mutex& tier_mu, Device& device, uint32_t max_clients)
      : mu_(tier_mu), device_(device), max_clients_(max_clients) {}
  ClientTable(const ClientTable&) = delete;
  ClientTable& operator=(const ClientTable&) = delete;

  // A new client with a drain stream and `done_events` of its own; RESOURCE_EXHAUSTED when
  // max_clients are open (the events are then the caller's still).
  // REQUIRES: the tier's lock is not held (creating a stream is a device call).
  absl::StatusOr<ClientId> Open(const ClientLimits& limits, std::vector<uint32_t> done_events)
      ABSL_LOCKS_EXCLUDED(mu_);

  // ---- REQUIRES: the tier's lock, for all of these.
  // The open client `id`, or nullptr when it is unknown or closed.
  GpuClient* Find(ClientId id);
  // Client `id`, open or closed but still draining, or nullptr.
  GpuClient* FindAny(ClientId id);
  const GpuClient* FindAny(ClientId id) const;
  // Forgets a client; returns its record (nullptr when unknown).
  std::unique_ptr<GpuClient> Erase(ClientId id);
  // Every client still known (open, or closed with drains in flight).
  std::vector<ClientId> Ids() const;
  // Sessions open: closed clients and the daemon's own (ClientLimits::daemons_own) are not counted.
  uint32_t OpenCount() const;

  // Records `lease` held by `client`; returns its id.
  uint64_t AddLease(GpuClient& client, GpuClient::Lease lease);
  // Takes lease `lease_id` off the client, with its staging bytes. NOT_FOUND for a lease the
  // client never had; FAILED_PRECONDITION for one already released.
  absl::StatusOr<GpuClient::Lease> TakeLease(GpuClient& client, uint64_t lease_id);
  // Takes reservation `reservation_id` off the client, with its staging bytes.
  // FAILED_PRECONDITION when it is not open.
  absl::StatusOr<GpuClient::Reservation> TakeReservation(GpuClient& client,
                                                         uint64_t reservation_id);
  // Counts one more pin of `object` (on the object too), charging the client's staging bytes on
  // its first pin of the key; RESOURCE_EXHAUSTED (nothing counted) when the quota is exceeded.
  // REQUIRES: CheckPinnedVersion passed for the object.
  absl::Status AddPin(GpuClient& client, StagingObject* object);
  // Drops one pin of `key` (on the object too) and returns its object. REQUIRES: the client has
  // pinned `key`.
  StagingObject* DropPin(GpuClient& client, const std::string& key);
  // Drops one pin of `object` if the client's pin of its key is of that object; returns whether
  // it did.
  bool DropPinOf(GpuClient& client, StagingObject* object);

 private:
  absl::Status TooManyClients() const;

  absl::Mutex& mu_;
  Device& device_;
  const uint32_t max_clients_;
  std::map<ClientId, std::unique_ptr<GpuClient>> clients_ ABSL_GUARDED_BY(mu_);
  ClientId next_client_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace tierd

#endif  // TIERD_GPU_DETAIL_CLIENT_TABLE_H_
