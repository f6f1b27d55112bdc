#include "bench/bench_model.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "bench/bench_support.h"

namespace tierd::bench {

std::vector<Object> RegisteredObjects(tierd::Client& client, const std::string& model,
                                      const std::string& model_dir) {
  bool known = false;
  for (const tierd::v1::ModelSummary& summary : Check(client.ListModels(), "ListModels")) {
    known |= summary.name() == model;
  }
  if (!known) {
    if (model_dir.empty()) Die("--model-dir is required to register " + model);
    Progress(absl::StrCat("registering ", model, " from ", model_dir));
    Check(client.RegisterModel(model, model_dir, tierd::v1::GROUPING_TENSOR), "RegisterModel");
  }
  std::vector<Object> objects;
  for (const tierd::v1::ObjectInfo& info : Check(client.ListObjects(model), "ListObjects")) {
    objects.push_back({info.key(), info.size()});
  }
  if (objects.empty()) Die(model + " has no objects");
  return objects;
}

uint64_t TotalBytes(const std::vector<Object>& objects) {
  uint64_t total = 0;
  for (const Object& object : objects) total += object.size;
  return total;
}

absl::StatusOr<double> FetchAndWait(tierd::Session& session, tierd::Stream& stream,
                                    const std::vector<Object>& objects, bool prefetch_first) {
  std::vector<tierd::Lease> leases;
  leases.reserve(objects.size());
  const Clock::time_point start = Clock::now();
  if (prefetch_first) {
    std::vector<std::string> keys;
    for (const Object& object : objects) keys.push_back(object.key);
    if (absl::Status status = session.Prefetch(keys); !status.ok()) return status;
  }
  for (const Object& object : objects) {
    absl::StatusOr<tierd::Lease> lease = session.Fetch(object.key, stream);
    if (!lease.ok()) {
      return absl::Status(lease.status().code(),
                          absl::StrCat("fetch ", object.key, ": ", lease.status().message()));
    }
    leases.push_back(*std::move(lease));
  }
  if (absl::Status status = session.device().SynchronizeStream(stream); !status.ok()) {
    return status;
  }
  const double seconds = SecondsSince(start);
  for (size_t i = 0; i < objects.size(); ++i) {
    if (leases[i].size() != objects[i].size) {
      return absl::InternalError(absl::StrCat(objects[i].key, ": lease of ", leases[i].size(),
                                              " bytes, the object has ", objects[i].size));
    }
  }
  return seconds;
}

absl::Status EvictWaiting(tierd::Session& session, const std::string& prefix,
                          tierd::v1::Tier tier) {
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<tierd::v1::EvictResponse> response = session.Evict(prefix, tier);
    if (!response.ok()) return response.status();
    if (response->skipped() == 0) return absl::OkStatus();
    if (attempt == 5000) {
      return absl::FailedPreconditionError(absl::StrCat("evict ", prefix, ": objects stay busy"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace tierd::bench
