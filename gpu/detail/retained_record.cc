#include "gpu/detail/retained_record.h"

#include <cstdint>
#include <fstream>
#include <memory>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/log.h"
#include "storage/file_system.h"

namespace tierd {
namespace {

constexpr char kHeader[] = "tierd retained sets v1";

}  // namespace

absl::Status WriteRetainedRecord(const std::string& path, const std::vector<RecordedSet>& sets) {
  std::string text = absl::StrCat(kHeader, "\n");
  for (const RecordedSet& set : sets) {
    absl::StrAppend(&text, absl::ToInt64Milliseconds(set.ttl), "\t", set.asleep ? 1 : 0, "\t",
                    set.objects, "\t", set.target, "\n");
  }
  std::shared_ptr<FileSystem> file_system = FileSystemOrDefault(nullptr);
  const absl::string_view parts[] = {text};
  return WriteFileAtomically(*file_system, path, path + ".tmp", parts, 0600);
}

std::vector<RecordedSet> ReadRetainedRecord(const std::string& path, absl::Duration max_ttl,
                                            size_t max_sets,
                                            bool (*valid_target)(const std::string&)) {
  std::vector<RecordedSet> recorded;
  std::ifstream in(path);
  if (!in) return recorded;  // nothing recorded yet
  std::string line;
  if (!std::getline(in, line) || line != kHeader) {
    TIERD_LOG(WARNING) << "retained sets: " << path << " is not a record of retained sets; ignored";
    return recorded;
  }
  std::set<std::string> seen;
  while (std::getline(in, line)) {
    std::vector<std::string> fields = absl::StrSplit(line, absl::MaxSplits('\t', 3));
    int64_t ttl_ms = 0;
    size_t objects = 0;
    if (fields.size() != 4 || !absl::SimpleAtoi(fields[0], &ttl_ms) || ttl_ms < 0 ||
        (fields[1] != "0" && fields[1] != "1") || !absl::SimpleAtoi(fields[2], &objects) ||
        !valid_target(fields[3])) {
      TIERD_LOG(WARNING) << "retained sets: skipping a malformed line of " << path;
      continue;
    }
    if (absl::Milliseconds(ttl_ms) > max_ttl) {
      TIERD_LOG(WARNING) << "retained sets: skipping a line of " << path
                         << " whose time to live is over " << absl::FormatDuration(max_ttl);
      continue;
    }
    if (!seen.insert(fields[3]).second) continue;  // a target twice: the first counts
    if (recorded.size() == max_sets) {
      TIERD_LOG(WARNING) << "retained sets: " << path << " records more than " << max_sets
                         << " sets; the rest are not retained again";
      break;
    }
    recorded.push_back({absl::Milliseconds(ttl_ms), fields[1] == "1", objects, fields[3]});
  }
  return recorded;
}

}  // namespace tierd
