// --reader-threads=auto: what a path lives on, read from a sysfs tree built here (disks,
// partitions, a device-mapper stack), and the threads chosen from it and the cores.
#include "storage/io/reader_sizing.h"

#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

namespace fs = std::filesystem;
using ::tierd::testing::TempDir;

constexpr long kTmpfsMagic = 0x01021994;

// A sysfs tree under a temporary directory: /sys/devices/.../block/NAME and the
// /sys/dev/block/MAJOR:MINOR links to them.
class FakeSysfs {
 public:
  const std::string& root() const { return dir_.path(); }

  // A disk NAME with `queues` blk-mq queues, rotational or not.
  fs::path AddDisk(const std::string& name, bool rotational, int queues) {
    const fs::path disk = Block() / name;
    fs::create_directories(disk / "queue");
    std::ofstream(disk / "queue" / "rotational") << (rotational ? "1\n" : "0\n");
    for (int q = 0; q < queues; ++q) fs::create_directories(disk / "mq" / std::to_string(q));
    return disk;
  }
  fs::path AddPartition(const fs::path& disk, const std::string& name) {
    fs::create_directories(disk / name);
    std::ofstream(disk / name / "partition") << "1\n";
    return disk / name;
  }
  // A device-mapper device over `under`.
  fs::path AddStack(const std::string& name, const std::vector<fs::path>& under) {
    const fs::path device = Block() / name;
    fs::create_directories(device / "slaves");
    for (const fs::path& slave : under)
      fs::create_symlink(slave, device / "slaves" / slave.filename());
    return device;
  }
  void Link(unsigned major, unsigned minor, const fs::path& device) {
    fs::create_directories(fs::path(root()) / "dev" / "block");
    fs::create_symlink(device,
                       fs::path(root()) / "dev" / "block" / absl::StrCat(major, ":", minor));
  }

 private:
  fs::path Block() const { return fs::path(root()) / "devices" / "pci0" / "block"; }
  TempDir dir_;
};

TEST(ReaderSizingTest, ADiskAPartitionAndAStackAreFollowedDownToTheirDisks) {
  FakeSysfs sys;
  const fs::path nvme0 = sys.AddDisk("nvme0n1", false, 8);
  const fs::path nvme1 = sys.AddDisk("nvme1n1", false, 8);
  const fs::path sda = sys.AddDisk("sda", true, 1);
  sys.Link(259, 0, nvme0);
  sys.Link(259, 1, sys.AddPartition(nvme0, "nvme0n1p1"));
  sys.Link(253, 0, sys.AddStack("dm-0", {nvme0, nvme1}));
  sys.Link(253, 1, sys.AddStack("dm-1", {nvme1, sda}));
  sys.Link(8, 0, sda);

  StorageUnder disk = DescribeBlockDevice(sys.root(), 259, 0);
  EXPECT_EQ(disk.kind, StorageKind::kSolidState);
  EXPECT_EQ(disk.disks, std::vector<std::string>{"nvme0n1"});
  EXPECT_EQ(disk.hardware_queues, 8);
  EXPECT_EQ(disk.Describe(), "solid-state nvme0n1 (8 queues)");

  StorageUnder partition = DescribeBlockDevice(sys.root(), 259, 1);
  EXPECT_EQ(partition.disks, std::vector<std::string>{"nvme0n1"});

  StorageUnder striped = DescribeBlockDevice(sys.root(), 253, 0);
  EXPECT_EQ(striped.kind, StorageKind::kSolidState);
  EXPECT_EQ(striped.disks.size(), 2u);
  EXPECT_EQ(striped.hardware_queues, 16);

  // A stack with a rotational disk in it reads at that disk's pace.
  EXPECT_EQ(DescribeBlockDevice(sys.root(), 253, 1).kind, StorageKind::kRotational);
  EXPECT_EQ(DescribeBlockDevice(sys.root(), 8, 0).kind, StorageKind::kRotational);
  // A device sysfs does not list cannot be told.
  EXPECT_EQ(DescribeBlockDevice(sys.root(), 7, 7).kind, StorageKind::kUnknown);
}

TEST(ReaderSizingTest, ThreadsFollowTheStorageUnderThePathAndTheCores) {
  TempDir files;
  struct stat st;
  ASSERT_EQ(::stat(files.path().c_str(), &st), 0);
  struct statfs file_system;
  ASSERT_EQ(::statfs(files.path().c_str(), &file_system), 0);
  if (file_system.f_type == kTmpfsMagic) GTEST_SKIP() << "the temporary directory is on tmpfs";
  const unsigned major_number = major(st.st_dev);
  const unsigned minor_number = minor(st.st_dev);

  // The path's own device, described as two solid-state disks under device-mapper.
  FakeSysfs striped;
  striped.Link(major_number, minor_number,
               striped.AddStack("dm-0", {striped.AddDisk("nvme0n1", false, 16),
                                         striped.AddDisk("nvme1n1", false, 16)}));
  ReaderSizing sizing = SizeReaders({files.path()}, 16, striped.root());
  EXPECT_EQ(sizing.threads, 4);  // two per disk
  EXPECT_NE(sizing.why.find("solid-state nvme0n1+nvme1n1 (32 queues)"), std::string::npos)
      << sizing.why;
  // Never more than half the cores, never fewer than 2.
  EXPECT_EQ(SizeReaders({files.path()}, 6, striped.root()).threads, 3);
  EXPECT_EQ(SizeReaders({files.path()}, 2, striped.root()).threads, 2);

  FakeSysfs rotational;
  rotational.Link(major_number, minor_number, rotational.AddDisk("vda", true, 1));
  EXPECT_EQ(SizeReaders({files.path()}, 16, rotational.root()).threads, 2);

  FakeSysfs empty;  // no sysfs: the default
  sizing = SizeReaders({files.path()}, 16, empty.root());
  EXPECT_EQ(sizing.threads, 2);
  EXPECT_NE(sizing.why.find("cannot be told"), std::string::npos) << sizing.why;
  EXPECT_EQ(SizeReaders({}, 16, empty.root()).threads, 2);
}

TEST(ReaderSizingTest, AMemoryBackedFileSystemGetsAThreadPerCoreUpToThirtyTwo) {
  struct statfs file_system;
  if (::statfs("/dev/shm", &file_system) != 0 || file_system.f_type != kTmpfsMagic) {
    GTEST_SKIP() << "no tmpfs at /dev/shm";
  }
  EXPECT_EQ(DescribeStorage("/dev/shm").kind, StorageKind::kMemory);
  EXPECT_EQ(SizeReaders({"/dev/shm"}, 16).threads, 16);
  EXPECT_EQ(SizeReaders({"/dev/shm"}, 64).threads, 32);
  EXPECT_EQ(SizeReaders({"/dev/shm"}, 10).threads, 10);
  EXPECT_EQ(SizeReaders({"/dev/shm"}, 1).threads, 2);
  // The fastest storage among the paths decides.
  TempDir other;
  EXPECT_EQ(SizeReaders({other.path(), "/dev/shm"}, 16).threads, 16);
}

}  // namespace
}  // namespace tierd
