// The catalog's persisted form of a model: one JSON file per model holding its files, objects,
// tensors and extents, and the checksums recorded for its objects. Serializing and parsing only:
// where the files live and how they are written is the catalog's business.
//
// Stateless; thread-safe.
#ifndef TIERD_STORAGE_MODEL_CATALOG_FILE_H_
#define TIERD_STORAGE_MODEL_CATALOG_FILE_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/model.h"

namespace tierd {

// A model read back from its file, with the checksums recorded for its objects (object name →
// checksum).
struct LoadedModel {
  ModelInfo info;
  std::map<std::string, uint64_t> checksums;
  // Checksums the file held in a form no longer computed (a file of an earlier format), dropped:
  // the objects' next reads record them again. The file should be written again.
  int checksums_dropped = 0;
};

// The file's contents for `info` and `checksums` (compact JSON). INVALID_ARGUMENT when a path or
// tensor name is not UTF-8: JSON strings are, and a mangled name would not match on reload.
absl::StatusOr<std::string> SerializeModel(const ModelInfo& info,
                                           const std::map<std::string, uint64_t>& checksums);

// Parses and checks a persisted model; `expected_name` is the one its file name says. Every object
// must be self-consistent and inside the recorded files (ValidateObject), and the objects sorted by
// name; a checksum of an object the model lacks is dropped, and so are a format-1 file's checksums
// of objects over one segment and of shards (whole-object checksums, which for those differ from
// the ones computed now; LoadedModel::checksums_dropped). DATA_LOSS ("malformed catalog file:
// ...") otherwise.
absl::StatusOr<LoadedModel> ParseModel(absl::string_view text, const std::string& expected_name);

}  // namespace tierd

#endif  // TIERD_STORAGE_MODEL_CATALOG_FILE_H_
