#include "server/stats.h"

namespace tierd {
namespace {

void AddTo(GpuTierStats& total, const GpuTierStats& tier) {
  total.budget_bytes += tier.budget_bytes;
  total.used_bytes += tier.used_bytes;
  total.objects += tier.objects;
  total.hits += tier.hits;
  total.misses += tier.misses;
  total.evictions += tier.evictions;
  total.bytes_host_to_gpu += tier.bytes_host_to_gpu;
  total.bytes_gpu_to_host += tier.bytes_gpu_to_host;
  total.peer_fetches += tier.peer_fetches;
  total.bytes_peer_to_gpu += tier.bytes_peer_to_gpu;
  total.peer_fetches_through_host += tier.peer_fetches_through_host;
  total.copies_in_flight += tier.copies_in_flight;
  total.allocation_waiters += tier.allocation_waiters;
  total.clients += tier.clients;
  total.leases += tier.leases;
  total.reservations += tier.reservations;
  total.pins += tier.pins;
  total.slabs += tier.slabs;
  total.events += tier.events;
}

void SetTierStats(v1::TierStats* out, const GpuTierStats& gpu) {
  out->set_budget_bytes(gpu.budget_bytes);
  out->set_used_bytes(gpu.used_bytes);
  out->set_objects(gpu.objects);
  out->set_hits(gpu.hits);
  out->set_misses(gpu.misses);
  out->set_evictions(gpu.evictions);
}

void AddGroup(v1::Stats& stats, const std::string& name, const GpuTierStats& gpu) {
  v1::ClientGroupStats* group = stats.add_client_groups();
  group->set_name(name);
  SetTierStats(group->mutable_gpu(), gpu);
  group->set_sessions(gpu.clients);
  group->set_leases(gpu.leases);
  group->set_reservations(gpu.reservations);
  group->set_pins(gpu.pins);
  group->set_slabs(gpu.slabs);
}

}  // namespace

v1::Stats CollectStats(Catalog& catalog, HostCache& host_cache, GpuTier& gpu_tier,
                       const std::vector<NamedGpuTier>& client_groups, const std::string& device) {
  v1::Stats stats;
  GpuTierStats gpu = gpu_tier.stats();
  if (!client_groups.empty()) {
    AddGroup(stats, "default", gpu);
    for (const NamedGpuTier& group : client_groups) {
      const GpuTierStats own = group.tier->stats();
      AddGroup(stats, group.name, own);
      AddTo(gpu, own);
    }
  }
  const HostCacheStats host = host_cache.stats();
  stats.set_device(device);
  SetTierStats(stats.mutable_gpu(), gpu);
  v1::TierStats* host_out = stats.mutable_host();
  host_out->set_budget_bytes(host.capacity_bytes);
  host_out->set_used_bytes(host.used_bytes);
  host_out->set_objects(host.objects);
  host_out->set_hits(host.hits);
  host_out->set_misses(host.misses);
  host_out->set_evictions(host.evictions);
  stats.set_host_pinned_bytes(host.pinned_bytes);
  stats.set_stored_objects(host.stored_objects);
  stats.set_spilled_objects(host.spilled_objects);
  stats.set_bytes_disk_to_host(host.bytes_from_disk);
  stats.set_bytes_host_to_gpu(gpu.bytes_host_to_gpu);
  stats.set_bytes_gpu_to_host(gpu.bytes_gpu_to_host);
  stats.set_bytes_host_to_disk(host.bytes_to_spill);
  stats.set_disk_reads_in_flight(host.loading);
  stats.set_copies_in_flight(gpu.copies_in_flight);
  stats.set_sessions(gpu.clients);
  stats.set_leases(gpu.leases);
  stats.set_reservations(gpu.reservations);
  stats.set_pins(gpu.pins);
  stats.set_checksum_failures(host.checksum_failures);
  stats.set_models(catalog.model_count());
  stats.set_slabs(gpu.slabs);
  stats.set_events(gpu.events);
  stats.set_gpu_allocation_waiters(gpu.allocation_waiters);
  stats.set_spills(host.spills);
  stats.set_spill_failures(host.spill_failures);
  stats.set_peer_fetches(gpu.peer_fetches);
  stats.set_bytes_peer_to_gpu(gpu.bytes_peer_to_gpu);
  stats.set_peer_fetches_through_host(gpu.peer_fetches_through_host);
  if (const DurableStore* durable = gpu_tier.durable_store(); durable != nullptr) {
    const DurableStoreStats on_disk = durable->stats();
    stats.set_durable_objects(on_disk.objects);
    stats.set_durable_bytes(on_disk.bytes);
    stats.set_durable_write_failures(on_disk.persist_failures);
  }
  return stats;
}

}  // namespace tierd
