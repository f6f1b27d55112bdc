#include "storage/model/json_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/posix_error.h"

namespace tierd {
namespace {

// Nesting of arrays and objects outside strings; stops counting once past `max_depth`.
bool NestingWithin(absl::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> ReadFileBounded(const std::string& path, uint64_t max_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return PosixError(absl::StrCat("opening ", path), errno);
  absl::StatusOr<std::string> text = ReadFileBounded(fd, path, max_bytes);
  close(fd);
  return text;
}

absl::StatusOr<std::string> ReadFileBounded(int fd, const std::string& path, uint64_t max_bytes) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return PosixError(path, errno);
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is ", st.st_size, " bytes; more than the ", max_bytes, " allowed"));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = pread(fd, text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return PosixError(absl::StrCat("reading ", path), errno);
    if (n == 0) break;  // shrank since fstat: what is there is what there is
    done += static_cast<size_t>(n);
  }
  text.resize(done);
  return text;
}

std::optional<nlohmann::json> ParseBoundedJson(absl::string_view text, int max_depth) {
  // nlohmann builds the whole tree before anything can be checked: a few megabytes of '[' would
  // cost gigabytes of nodes.
  if (!NestingWithin(text, max_depth)) return std::nullopt;
  nlohmann::json json =
      nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return std::nullopt;
  return json;
}

const nlohmann::json* JsonMember(const nlohmann::json* object, const char* key) {
  if (object == nullptr || !object->is_object()) return nullptr;
  auto it = object->find(key);
  return it == object->end() ? nullptr : &*it;
}

bool JsonString(const nlohmann::json* value, std::string* out) {
  if (value == nullptr || !value->is_string()) return false;
  *out = value->get_ref<const std::string&>();
  return true;
}

bool JsonUint(const nlohmann::json* value, uint64_t* out) {
  // nlohmann stores every non-negative integer as unsigned, so this accepts exactly those.
  if (value == nullptr || !value->is_number_unsigned()) return false;
  *out = value->get<uint64_t>();
  return true;
}

bool JsonInt(const nlohmann::json* value, int64_t* out) {
  if (value == nullptr || !value->is_number_integer()) return false;
  if (value->is_number_unsigned() && value->get<uint64_t>() > INT64_MAX) return false;
  *out = value->get<int64_t>();
  return true;
}

bool JsonIsArray(const nlohmann::json* value) { return value != nullptr && value->is_array(); }

bool JsonIsObject(const nlohmann::json* value) { return value != nullptr && value->is_object(); }

}  // namespace tierd
