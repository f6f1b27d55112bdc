#include "storage/io/reader_sizing.h"

#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "storage/io/detail/memory_read.h"

namespace tierd {
namespace {

namespace fs = std::filesystem;

constexpr int kMostThreads = 8;
constexpr int kFewestThreads = 2;
// Reading memory-backed files is the reader threads' own copying (storage/io/detail/memory_read.h).
constexpr int kMostMemoryThreads = 32;
constexpr int kThreadsPerSolidStateDisk = 2;
constexpr int kMostDeviceDepth = 8;  // device-mapper / md stacks deeper than this are not followed

std::string ReadLine(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

int CountEntries(const fs::path& directory) {
  std::error_code error;
  int count = 0;
  for (fs::directory_iterator it(directory, error), end; !error && it != end; it.increment(error)) {
    ++count;
  }
  return count;
}

// Adds the disks under the sysfs directory of a block device (a disk, a partition, or a
// device-mapper / md device stacked on others) to `under`.
void AddDisks(const fs::path& device, int depth, std::set<std::string>& seen, StorageUnder& under,
              bool& any_rotational, bool& any_solid_state) {
  std::error_code error;
  fs::path disk = fs::canonical(device, error);
  if (error || depth > kMostDeviceDepth) return;
  // A partition's directory sits inside its disk's.
  if (fs::exists(disk / "partition")) disk = disk.parent_path();
  const fs::path slaves = disk / "slaves";
  if (CountEntries(slaves) > 0) {
    for (fs::directory_iterator it(slaves, error), end; !error && it != end; it.increment(error)) {
      AddDisks(it->path(), depth + 1, seen, under, any_rotational, any_solid_state);
    }
    return;
  }
  const std::string name = disk.filename().string();
  if (!seen.insert(name).second) return;
  const std::string rotational = ReadLine(disk / "queue" / "rotational");
  if (rotational.empty()) return;  // not a disk sysfs describes
  under.disks.push_back(name);
  under.hardware_queues += CountEntries(disk / "mq");
  (rotational == "1" ? any_rotational : any_solid_state) = true;
}

}  // namespace

std::string StorageUnder::Describe() const {
  switch (kind) {
    case StorageKind::kMemory:
      return "a memory-backed file system";
    case StorageKind::kUnknown:
      return "storage that cannot be told";
    case StorageKind::kRotational:
    case StorageKind::kSolidState:
      return absl::StrCat(kind == StorageKind::kRotational ? "rotational " : "solid-state ",
                          absl::StrJoin(disks, "+"), " (", hardware_queues,
                          hardware_queues == 1 ? " queue)" : " queues)");
  }
  return "";
}

StorageUnder DescribeBlockDevice(const std::string& sys_root, unsigned major, unsigned minor) {
  StorageUnder under;
  std::set<std::string> seen;
  bool any_rotational = false;
  bool any_solid_state = false;
  AddDisks(fs::path(sys_root) / "dev" / "block" / absl::StrCat(major, ":", minor), 0, seen, under,
           any_rotational, any_solid_state);
  // A stack mixing both reads at the pace of its rotational part.
  if (any_rotational) {
    under.kind = StorageKind::kRotational;
  } else if (any_solid_state) {
    under.kind = StorageKind::kSolidState;
  }
  return under;
}

StorageUnder DescribeStorage(const std::string& given, const std::string& sys_root) {
  // A directory not made yet will live where its nearest existing ancestor does.
  std::error_code error;
  fs::path existing = fs::absolute(given, error);
  while (!error && !fs::exists(existing, error) && existing.has_relative_path()) {
    existing = existing.parent_path();
  }
  const std::string path = existing.string();
  struct statfs file_system;
  if (::statfs(path.c_str(), &file_system) == 0 && IsMemoryFileSystem(file_system.f_type)) {
    StorageUnder under;
    under.kind = StorageKind::kMemory;
    return under;
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return StorageUnder();
  return DescribeBlockDevice(sys_root, major(st.st_dev), minor(st.st_dev));
}

ReaderSizing SizeReaders(const std::vector<std::string>& paths, int cores,
                         const std::string& sys_root) {
  const int most = std::max(kFewestThreads, std::min(kMostThreads, cores / 2));
  ReaderSizing sizing;
  sizing.threads = kFewestThreads;
  std::string reason;
  for (const std::string& path : paths) {
    const StorageUnder under = DescribeStorage(path, sys_root);
    int threads = kFewestThreads;
    if (under.kind == StorageKind::kMemory) {
      threads = std::clamp(cores, kFewestThreads, kMostMemoryThreads);
    } else if (under.kind == StorageKind::kSolidState) {
      threads = std::clamp(kThreadsPerSolidStateDisk * static_cast<int>(under.disks.size()),
                           kFewestThreads, most);
    }
    if (reason.empty() || threads > sizing.threads) {
      sizing.threads = threads;
      reason = absl::StrCat(under.Describe(), " under ", path);
    }
  }
  if (reason.empty()) reason = "no path to look at";
  sizing.why = absl::StrCat(sizing.threads, " (", reason, "; ", cores, " cores)");
  return sizing;
}

}  // namespace tierd
