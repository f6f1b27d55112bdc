// Where a model directory, a model root or a model file is: a path of this machine's file systems,
// or an object of an object store (an s3:// URL, parsed). ParseModelLocation is the one place a
// path's kind is told apart — at registration, from a root flag, when the catalog is loaded —
// and what comes after asks the parsed location (ModelFile::object, ModelInfo::in_object_store),
// never the string's scheme again. A second kind of store is added here.
#ifndef TIERD_STORAGE_MODEL_LOCATION_H_
#define TIERD_STORAGE_MODEL_LOCATION_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "remote/s3_location.h"

namespace tierd {

struct ModelLocation {
  enum class Kind { kLocal, kObjectStore };
  Kind kind = Kind::kLocal;
  std::string path;  // kLocal: the path as given (not checked here: the roots check it)
  S3Url object;      // kObjectStore: the bucket and the key (or key prefix)

  bool in_object_store() const { return kind == Kind::kObjectStore; }
  // The path, or the object's URL.
  std::string ToString() const;
};

// `path`'s location. INVALID_ARGUMENT, saying why, for an object store's URL that does not parse
// (ParseS3Url); any other string is a local path.
absl::StatusOr<ModelLocation> ParseModelLocation(absl::string_view path);

}  // namespace tierd

#endif  // TIERD_STORAGE_MODEL_LOCATION_H_
