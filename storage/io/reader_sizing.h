// --reader-threads=auto: how many disk reader threads suit the storage under the daemon's files on
// this machine. Looks at what each path lives on — a memory-backed file system (tmpfs, ramfs), or
// block devices found through sysfs (partitions and device-mapper / md stacks followed down to the
// disks), solid-state or rotational, and their hardware queue counts — and at the cores:
//  - memory-backed: a read is the reader thread's own copy of the pages (and its hash of them),
//    so it scales with threads like pread does: one per core, at least 2, at most 32. Measured on
//    16 cores from tmpfs, the host load reached 0.59 of 16 pread threads with 8 readers, 0.80 with
//    12 and 0.98 with 16;
//  - solid-state disks: two threads per disk, at least 2, else at most half the cores and 8. Not
//    measured on NVMe yet (no machine here has one): the reasoning is that one ring of 16 reads of
//    4 MiB keeps a drive's queue busy and a second overlaps the completions' handling;
//  - rotational disks, or what cannot be told: 2, measured to read a virtual disk at 0.98 of fio.
//    What cannot be told includes file systems whose device number is not a block device's —
//    btrfs, ZFS, NFS, overlayfs (a container's root) — and machines without sysfs: set
//    --reader-threads there, or confine models with --model-roots to a directory on a plain one.
// The largest answer over the paths wins. The queue depth is left as configured (16 reads).
//
// Stateless; thread-safe.
#ifndef TIERD_STORAGE_IO_READER_SIZING_H_
#define TIERD_STORAGE_IO_READER_SIZING_H_

#include <string>
#include <vector>

namespace tierd {

enum class StorageKind { kUnknown, kMemory, kRotational, kSolidState };

// What one path lives on.
struct StorageUnder {
  StorageKind kind = StorageKind::kUnknown;
  std::vector<std::string> disks;  // block devices at the bottom of the stack ("nvme0n1")
  int hardware_queues = 0;         // summed over `disks` (blk-mq queues)
  std::string Describe() const;    // "tmpfs", "solid-state nvme0n1 (32 queues)", ...
};

// What `path` lives on (a path not made yet: its nearest existing ancestor); `sys_root` is where
// sysfs is mounted ("/sys").
StorageUnder DescribeStorage(const std::string& path, const std::string& sys_root = "/sys");

// What the block device MAJOR:MINOR is, from `sys_root` (/sys/dev/block/MAJOR:MINOR).
StorageUnder DescribeBlockDevice(const std::string& sys_root, unsigned major, unsigned minor);

struct ReaderSizing {
  int threads = 2;
  std::string why;  // for the log: "8 (tmpfs under /models; 16 cores)"
};

// The reader threads for files under `paths` on a machine of `cores` cores.
ReaderSizing SizeReaders(const std::vector<std::string>& paths, int cores,
                         const std::string& sys_root = "/sys");

}  // namespace tierd

#endif  // TIERD_STORAGE_IO_READER_SIZING_H_
