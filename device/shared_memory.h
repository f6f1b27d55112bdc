// A POSIX shared memory object mapped into this process: the storage behind HostDevice's slabs and
// event tables. The creator owns the name and unlinks it on destruction; openers only map it. A
// mapping stays valid after the name is unlinked, until it is unmapped.
#ifndef TIERD_DEVICE_SHARED_MEMORY_H_
#define TIERD_DEVICE_SHARED_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tierd {

class SharedMemory {
 public:
  // Creates `name` (a single path component starting with '/') with `bytes` of storage reserved
  // up front, so running out of /dev/shm is RESOURCE_EXHAUSTED here rather than SIGBUS on first
  // touch. Contents are zero. Errors: ALREADY_EXISTS, RESOURCE_EXHAUSTED, INVALID_ARGUMENT.
  static absl::StatusOr<std::unique_ptr<SharedMemory>> Create(const std::string& name,
                                                              size_t bytes);
  // Maps an existing object read-write. Errors: NOT_FOUND, PERMISSION_DENIED.
  static absl::StatusOr<std::unique_ptr<SharedMemory>> Open(const std::string& name);

  ~SharedMemory();
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  SharedMemory(std::string name, void* data, size_t size, bool owner)
      : name_(std::move(name)), data_(data), size_(size), owner_(owner) {}

  std::string name_;
  void* data_;
  size_t size_;
  bool owner_;
};

// Bytes shared memory objects may still take: the free space of the filesystem behind them
// (/dev/shm). Errors: statvfs's.
absl::StatusOr<uint64_t> SharedMemoryFreeBytes();

// The name prefix of every shared memory object a process with this pid creates: "/tierd.<pid>.".
std::string SharedMemoryPrefixForPid(int pid);

// Unlinks shared memory objects left behind by tierd processes that no longer run (a crash skips
// the destructors). Returns how many were removed.
int RemoveStaleSharedMemory();

}  // namespace tierd

#endif  // TIERD_DEVICE_SHARED_MEMORY_H_
