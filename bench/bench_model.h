// A model as the benchmarks drive it: registered with the daemon (per-tensor objects) when not yet
// known, listed as its objects, fetched to the GPU and evicted again through a session.
#ifndef TIERD_BENCH_BENCH_MODEL_H_
#define TIERD_BENCH_BENCH_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/tierd_client.h"

namespace tierd::bench {

struct Object {
  std::string key;
  uint64_t size;
};

// The objects of `model`, which is registered from `model_dir` with per-tensor grouping first when
// the daemon does not know it. Dies on any error, on an unknown model without `model_dir`, and on
// a model without objects.
std::vector<Object> RegisteredObjects(tierd::Client& client, const std::string& model,
                                      const std::string& model_dir);

uint64_t TotalBytes(const std::vector<Object>& objects);

// Fetches `objects` through `session` on `stream` and waits for their bytes; returns the seconds
// that took. `prefetch_first` sends one prefetch of them all before the fetches, as a loader does.
// The leases are released after the timing. Errors: the session's, and INTERNAL for a lease whose
// size is not its object's.
absl::StatusOr<double> FetchAndWait(tierd::Session& session, tierd::Stream& stream,
                                    const std::vector<Object>& objects, bool prefetch_first);

// Evicts `prefix` from `tier` through `session`, retrying while releases drain.
// Errors: the session's; FAILED_PRECONDITION when objects stay busy for about 5 s.
absl::Status EvictWaiting(tierd::Session& session, const std::string& prefix, tierd::v1::Tier tier);

}  // namespace tierd::bench

#endif  // TIERD_BENCH_BENCH_MODEL_H_
