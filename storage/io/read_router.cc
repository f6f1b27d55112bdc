#include "storage/io/read_router.h"

#include <utility>

namespace tierd {

ReadRouter::RequestId ReadRouter::Submit(ReadRequest request) {
  size_t remote_targets = 0;
  for (const ReadTarget& target : request.targets) {
    remote_targets += target.model_file != nullptr && target.model_file->object.has_value();
  }
  if (remote_targets == 0) return Local(local_.Submit(std::move(request)));
  absl::Status refused;
  if (remote_targets != request.targets.size()) {
    refused = absl::InvalidArgumentError("a read of local and remote files at once");
  } else if (remote_ == nullptr) {
    refused = absl::FailedPreconditionError(
        "a remote model file, and this daemon has no remote source (--s3-endpoint)");
  }
  if (!refused.ok()) {
    std::move(request.done)(refused);
    return Remote(0);  // known to neither: Cancel and Reprioritize say false
  }
  return Remote(remote_->Submit(std::move(request)));
}

bool ReadRouter::Cancel(RequestId id) {
  if (!IsRemote(id)) return local_.Cancel(id >> 1);
  return remote_ != nullptr && (id >> 1) != 0 && remote_->Cancel(id >> 1);
}

bool ReadRouter::Reprioritize(RequestId id, ReadPriority priority, absl::Time deadline) {
  if (!IsRemote(id)) return local_.Reprioritize(id >> 1, priority, deadline);
  return remote_ != nullptr && (id >> 1) != 0 && remote_->Reprioritize(id >> 1, priority, deadline);
}

}  // namespace tierd
