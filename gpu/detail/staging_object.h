// One object of the GPU tier: its bytes' place in staging, its state on the way there, and who
// holds or waits for it. The residency (staging_residency.h) lists it by key and frees it; client
// leases, pins and drains point at it, which is why all of them are under the tier's one lock.
// Internal to the GPU tier.
#ifndef TIERD_GPU_DETAIL_STAGING_OBJECT_H_
#define TIERD_GPU_DETAIL_STAGING_OBJECT_H_

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpu/gpu_tier_types.h"
#include "gpu/staging_pool.h"
#include "storage/catalog.h"

namespace tierd {

struct StagingObject {
  enum class State {
    kFetchingHost,  // waiting for the host tier
    kFetchingPeer,  // waiting for a peer daemon to lend it (unlisted: see GpuTier::Fetch)
    kAllocating,    // has the host bytes, waiting for staging room
    kResident,      // the copy into staging is enqueued (or done) and the ready event recorded
  };
  struct Waiter {
    ClientId client = 0;
    GpuLeaseCallback lease;     // a fetch, or
    GpuStatusCallback pin;      // a pin (the pin itself is already counted)
    bool through_host = false;  // the fetch's FetchOptions::through_host
  };

  std::string key;
  uint64_t size = 0;
  Tensors tensors;
  std::shared_ptr<const ModelInfo> model;  // weights: the registration the bytes belong to
  State state = State::kFetchingHost;
  bool listed = false;
  std::optional<StagingRange> range;
  std::optional<uint32_t> ready_event;
  bool copying = false;  // a copy into or out of the range has not completed
  int leases = 0;        // held and draining
  int pins = 0;
  bool demand = false;
  int host_fetches = 0;  // host fetches not answered yet
  std::vector<Waiter> waiters;
  std::list<StagingObject*>::iterator lru_position;
  bool in_lru = false;
};

}  // namespace tierd

#endif  // TIERD_GPU_DETAIL_STAGING_OBJECT_H_
