#include "server/client_groups.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/byte_size.h"

namespace tierd {
namespace {

bool ValidGroupName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

absl::Status BadEntry(absl::string_view entry, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("--client-groups: '", entry, "': ", why, " (want NAME:UNIXGROUP:BYTES[:RETAIN_BYTES])"));
}

}  // namespace

absl::StatusOr<std::vector<ClientGroupOptions>> ParseClientGroups(absl::string_view spec) {
  std::vector<ClientGroupOptions> groups;
  std::set<std::string> names;
  for (absl::string_view entry : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    const std::vector<absl::string_view> parts = absl::StrSplit(entry, ':');
    if (parts.size() != 3 && parts.size() != 4) {
      return BadEntry(entry, "three or four fields separated by ':'");
    }
    ClientGroupOptions group;
    group.name = std::string(parts[0]);
    group.unix_group = std::string(parts[1]);
    if (!ValidGroupName(group.name)) {
      return BadEntry(entry, "the name must be 1-64 characters of [A-Za-z0-9_-]");
    }
    if (group.name == "default") return BadEntry(entry, "'default' is the main sockets' group");
    if (group.unix_group.empty()) return BadEntry(entry, "no Unix group");
    absl::StatusOr<uint64_t> bytes = ParseByteSize(parts[2]);
    if (!bytes.ok() || *bytes == 0) return BadEntry(entry, "the GPU pool size must be above 0");
    group.gpu_pool_bytes = *bytes;
    if (parts.size() == 4) {
      absl::StatusOr<uint64_t> retain = ParseByteSize(parts[3]);
      if (!retain.ok() || *retain > group.gpu_pool_bytes) {
        return BadEntry(entry, "the retained bytes must be a size of at most the GPU pool's");
      }
      group.retain_bytes = *retain;
    }
    if (!names.insert(group.name).second) return BadEntry(entry, "the name is given twice");
    groups.push_back(std::move(group));
  }
  return groups;
}

std::string ClientGroupKeyPrefix(const std::string& name) { return absl::StrCat("@", name, "/"); }

}  // namespace tierd
