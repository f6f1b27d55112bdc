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
  // Maps an existing object read-only (PROT_READ): a write through data() faults. Same errors as
  // Open.
  static absl::StatusOr<std::unique_ptr<SharedMemory>> OpenReadOnly(const std::string& name);

  ~SharedMemory();
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  // REQUIRES: not read_only() when written through.
  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  bool read_only() const { return read_only_; }

  // Maps the object read-write in place of this read-only mapping, at the same address: data()
  // does not change, and the bytes are the same. Reopens the name, so it must still exist.
  // Errors: Open's; after a failure of the mapping itself (ENOMEM) the range may be left unmapped
  // (the kernel drops the old mapping first), so the caller must not read through data() again.
  // REQUIRES: not called concurrently with itself; nothing (no device registration) depends on
  // the mapping being the read-only one.
  absl::Status MakeWritable();

 private:
  SharedMemory(std::string name, void* data, size_t size, bool owner, bool read_only)
      : name_(std::move(name)), data_(data), size_(size), owner_(owner), read_only_(read_only) {}
  static absl::StatusOr<std::unique_ptr<SharedMemory>> OpenMapping(const std::string& name,
                                                                   bool read_only);

  std::string name_;
  void* data_;
  size_t size_;
  bool owner_;
  bool read_only_;
};

// Bytes shared memory objects may still take: the free space of the filesystem behind them
// (/dev/shm). Errors: statvfs's.
absl::StatusOr<uint64_t> SharedMemoryFreeBytes();
// The size of that filesystem. Errors: statvfs's.
absl::StatusOr<uint64_t> SharedMemoryTotalBytes();

// The name prefix of every shared memory object a process with this pid creates: "/tierd.<pid>.".
std::string SharedMemoryPrefixForPid(int pid);

// Unlinks shared memory objects left behind by tierd processes that no longer run (a crash skips
// the destructors). Returns how many were removed.
int RemoveStaleSharedMemory();

}  // namespace tierd

#endif  // TIERD_DEVICE_SHARED_MEMORY_H_
