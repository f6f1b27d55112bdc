#include "storage/model_location.h"

#include <utility>

namespace tierd {

std::string ModelLocation::ToString() const { return in_object_store() ? object.ToString() : path; }

absl::StatusOr<ModelLocation> ParseModelLocation(absl::string_view path) {
  ModelLocation location;
  if (IsS3Path(path)) {
    absl::StatusOr<S3Url> url = ParseS3Url(path);
    if (!url.ok()) return url.status();
    location.kind = ModelLocation::Kind::kObjectStore;
    location.object = *std::move(url);
    return location;
  }
  location.path = std::string(path);
  return location;
}

}  // namespace tierd
