#include "bench/bench_model.h"

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

}  // namespace tierd::bench
