// Reading JSON that may be hostile or damaged (a model's index, the catalog's own files) with
// bounded cost and without exceptions: the file size and the nesting depth are limited before
// nlohmann builds a tree, and typed access reports a missing or mistyped value instead of
// throwing. Stateless; thread-safe.
#ifndef TIERD_STORAGE_MODEL_JSON_FILE_H_
#define TIERD_STORAGE_MODEL_JSON_FILE_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tierd {

// The whole file at `path`. INVALID_ARGUMENT when it is larger than `max_bytes`; errors from
// opening or reading it otherwise.
absl::StatusOr<std::string> ReadFileBounded(const std::string& path, uint64_t max_bytes);
// The same from the open file `fd`, named `path` in errors; `fd` stays open.
absl::StatusOr<std::string> ReadFileBounded(int fd, const std::string& path, uint64_t max_bytes);

// nullopt when `text` is not JSON or nests deeper than `max_depth` arrays and objects.
std::optional<nlohmann::json> ParseBoundedJson(absl::string_view text, int max_depth = 64);

// The member `key` of `object`; nullptr when `object` is null, not an object, or lacks it.
const nlohmann::json* JsonMember(const nlohmann::json* object, const char* key);
// Each stores the value and returns true when `value` is non-null and of the right type and
// range; otherwise returns false and leaves `out` alone.
bool JsonString(const nlohmann::json* value, std::string* out);
bool JsonUint(const nlohmann::json* value, uint64_t* out);
bool JsonInt(const nlohmann::json* value, int64_t* out);
bool JsonIsArray(const nlohmann::json* value);
bool JsonIsObject(const nlohmann::json* value);

}  // namespace tierd

#endif  // TIERD_STORAGE_MODEL_JSON_FILE_H_
