#include "gpu/detail/client_table.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/status_macros.h"

namespace tierd {

absl::Status ClientGone() { return absl::UnavailableError("the session has ended"); }

absl::Status LargerThanSlab(const std::string& key, uint64_t bytes, uint64_t slab_bytes) {
  return absl::ResourceExhaustedError(
      absl::StrCat(key, " is ", FormatByteSize(bytes), ", larger than a GPU staging slab (",
                   FormatByteSize(slab_bytes), "): raise --gpu-slab-bytes"));
}

absl::Status GpuClient::CheckStagingQuota(const std::string& key, uint64_t bytes) const {
  if (staging_bytes + bytes <= limits.max_staging_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("the session's staging quota of ", FormatByteSize(limits.max_staging_bytes),
                   " would be exceeded (", FormatByteSize(staging_bytes), " held, ", key, " is ",
                   FormatByteSize(bytes), ")"));
}

absl::Status GpuClient::CheckLeaseQuota() const {
  if (leases.size() + pending_fetches < limits.max_leases) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the session holds its quota of ", limits.max_leases, " leases: release some first"));
}

absl::Status GpuClient::CheckPinnedVersion(const std::string& key,
                                           const StagingObject* listed) const {
  auto record = pins.find(key);
  if (record == pins.end() || record->second.object == listed) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(key, " changed since this session pinned it: unpin it, then pin it again"));
}

absl::Status GpuClient::CheckDoneEvent(uint32_t event) const {
  for (uint32_t own : done_events) {
    if (own == event) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("event ", event, " is not one of this session's done events"));
}

absl::StatusOr<ClientId> ClientTable::Open(const ClientLimits& limits,
                                           std::vector<uint32_t> done_events) {
  {
    absl::MutexLock lock(&mu_);
    if (!limits.daemons_own && OpenCount() >= max_clients_) return TooManyClients();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device_.CreateStream(StreamPriority::kNormal));
  absl::MutexLock lock(&mu_);
  if (!limits.daemons_own && OpenCount() >= max_clients_) return TooManyClients();
  auto client = std::make_unique<GpuClient>();
  client->id = next_client_++;
  client->limits = limits;
  client->drain_stream = std::move(stream);
  client->done_events = std::move(done_events);
  const ClientId id = client->id;
  clients_[id] = std::move(client);
  return id;
}

absl::Status ClientTable::TooManyClients() const {
  return absl::ResourceExhaustedError(
      absl::StrCat("the daemon already has ", max_clients_,
                   " sessions open (--max-sessions); close one, or share a session"));
}

GpuClient* ClientTable::Find(ClientId id) {
  GpuClient* client = FindAny(id);
  return client == nullptr || client->closed ? nullptr : client;
}

GpuClient* ClientTable::FindAny(ClientId id) {
  return const_cast<GpuClient*>(std::as_const(*this).FindAny(id));
}

const GpuClient* ClientTable::FindAny(ClientId id) const {
  mu_.AssertHeld();
  auto it = clients_.find(id);
  return it == clients_.end() ? nullptr : it->second.get();
}

std::unique_ptr<GpuClient> ClientTable::Erase(ClientId id) {
  mu_.AssertHeld();
  auto it = clients_.find(id);
  if (it == clients_.end()) return nullptr;
  std::unique_ptr<GpuClient> client = std::move(it->second);
  clients_.erase(it);
  return client;
}

std::vector<ClientId> ClientTable::Ids() const {
  mu_.AssertHeld();
  std::vector<ClientId> ids;
  for (const auto& [id, client] : clients_) ids.push_back(id);
  return ids;
}

uint32_t ClientTable::OpenCount() const {
  mu_.AssertHeld();
  uint32_t open = 0;
  for (const auto& [id, client] : clients_) {
    open += client->closed || client->limits.daemons_own ? 0 : 1;
  }
  return open;
}

uint64_t ClientTable::AddLease(GpuClient& client, GpuClient::Lease lease) {
  const uint64_t lease_id = client.next_lease++;
  client.staging_bytes += lease.object->size;
  ++lease.object->refs;
  if (lease.names_ready_event) ++lease.object->ready_event_leases;
  client.leases[lease_id] = std::move(lease);
  return lease_id;
}

absl::StatusOr<GpuClient::Lease> ClientTable::TakeLease(GpuClient& client, uint64_t lease_id) {
  auto it = client.leases.find(lease_id);
  if (it == client.leases.end()) {
    if (lease_id > 0 && lease_id < client.next_lease) {
      return absl::FailedPreconditionError(
          absl::StrCat("lease ", lease_id, " was already released"));
    }
    return absl::NotFoundError(absl::StrCat("this session has no lease ", lease_id));
  }
  const GpuClient::Lease lease = it->second;
  client.leases.erase(it);
  client.staging_bytes -= lease.object->size;
  return lease;
}

absl::StatusOr<GpuClient::Reservation> ClientTable::TakeReservation(GpuClient& client,
                                                                    uint64_t reservation_id) {
  auto it = client.reservations.find(reservation_id);
  if (it == client.reservations.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("reservation ", reservation_id,
                     " is not open in this session (never made, or already committed or aborted)"));
  }
  GpuClient::Reservation reservation = std::move(it->second);
  client.reservations.erase(it);
  client.staging_bytes -= reservation.length;
  return reservation;
}

absl::Status ClientTable::AddPin(GpuClient& client, StagingObject* object) {
  auto record = client.pins.find(object->key());
  if (record == client.pins.end()) {
    RETURN_IF_ERROR(client.CheckStagingQuota(object->key(), object->size));
    client.staging_bytes += object->size;
    record = client.pins.emplace(object->key(), GpuClient::PinRecord{object, 0}).first;
  }
  ++record->second.count;
  ++object->pins;
  return absl::OkStatus();
}

StagingObject* ClientTable::DropPin(GpuClient& client, const std::string& key) {
  auto record = client.pins.find(key);
  StagingObject* object = record->second.object;
  --object->pins;
  if (--record->second.count == 0) {
    client.staging_bytes -= object->size;
    client.pins.erase(record);
  }
  return object;
}

bool ClientTable::DropPinOf(GpuClient& client, StagingObject* object) {
  auto record = client.pins.find(object->key());
  if (record == client.pins.end() || record->second.object != object) return false;
  DropPin(client, object->key());
  return true;
}

}  // namespace tierd
