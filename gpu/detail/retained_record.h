// The file that records a tier's retained sets (gpu/retained_sets.h), so that they come back after
// a restart: a header line, then one line per set — its time to live in milliseconds, whether it
// sleeps (0 or 1), how many objects it had, and its target, separated by tabs. Written whole and
// atomically at each change; read as untrusted input (a line that does not parse, a time to live
// over the limit or a target given twice is skipped and logged; at most `max_sets` are read).
// Internal to the GPU tier.
#ifndef TIERD_GPU_DETAIL_RETAINED_RECORD_H_
#define TIERD_GPU_DETAIL_RETAINED_RECORD_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tierd {

struct RecordedSet {
  absl::Duration ttl;
  bool asleep = false;
  size_t objects = 0;
  std::string target;
};

// Replaces the record at `path` with `sets`; the file system's errors.
absl::Status WriteRetainedRecord(const std::string& path, const std::vector<RecordedSet>& sets);

// The sets recorded at `path`: none when there is no file (or it is not such a record, logged).
// Each target passes `valid_target`; none has a time to live over `max_ttl`.
std::vector<RecordedSet> ReadRetainedRecord(const std::string& path, absl::Duration max_ttl,
                                            size_t max_sets,
                                            bool (*valid_target)(const std::string&));

}  // namespace tierd

#endif  // TIERD_GPU_DETAIL_RETAINED_RECORD_H_
