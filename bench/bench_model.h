// A model as the benchmarks drive it: registered with the daemon (per-tensor objects) when not yet
// known, and listed as its objects.
#ifndef TIERD_BENCH_BENCH_MODEL_H_
#define TIERD_BENCH_BENCH_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

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

}  // namespace tierd::bench

#endif  // TIERD_BENCH_BENCH_MODEL_H_
