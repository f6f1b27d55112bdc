// Behaviour specific to HostDevice: its shared memory housekeeping and robustness.
#include "device/host_device.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "device/shared_memory.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;

bool ShmExists(const std::string& name) {
  int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

TEST(HostDeviceTest, SharedMemoryOfExitedProcessesIsRemovedOnCreate) {
  // A pid that certainly belongs to no running process: a child that has exited and been reaped.
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  const std::string stale = absl::StrCat(SharedMemoryPrefixForPid(child), "test.slab.0");
  const std::string live = absl::StrCat(SharedMemoryPrefixForPid(::getpid()), "test.slab.0");
  int fd = ::shm_open(stale.c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ::close(fd);
  auto mine = SharedMemory::Create(live, 4096);
  ASSERT_THAT(mine, IsOk());

  auto device = HostDevice::Create();
  ASSERT_THAT(device, IsOk());
  EXPECT_FALSE(ShmExists(stale));
  EXPECT_TRUE(ShmExists(live));
}

TEST(HostDeviceTest, DestroyedSlabLeavesNoSharedMemoryButOpenMappingsStayValid) {
  auto owner = HostDevice::Create();
  ASSERT_THAT(owner, IsOk());
  auto importer = HostDevice::Create();
  ASSERT_THAT(importer, IsOk());
  auto slab = (*owner)->AllocateSlab(1 << 20);
  ASSERT_THAT(slab, IsOk());
  static_cast<char*>((*slab)->data())[12345] = 'x';
  auto opened = (*importer)->OpenSlab((*slab)->handle());
  ASSERT_THAT(opened, IsOk());
  const std::string handle = (*slab)->handle();
  slab->reset();
  EXPECT_EQ(static_cast<char*>((*opened)->data())[12345], 'x');
  EXPECT_THAT((*importer)->OpenSlab(handle), StatusIs(absl::StatusCode::kNotFound));
}

// Larger than /dev/shm's whole size, which tmpfs refuses before it allocates a page. (Larger than
// its free space only, it would allocate pages until the space ran out: with /dev/shm as large as
// the machine's memory, as on the CI machines, that takes the machine's memory first.)
TEST(HostDeviceTest, SlabLargerThanSharedMemoryIsResourceExhaustedNotSigbus) {
  struct statvfs fs;
  ASSERT_EQ(::statvfs("/dev/shm", &fs), 0);
  const uint64_t size_bytes = static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize;
  auto device = HostDevice::Create();
  ASSERT_THAT(device, IsOk());
  EXPECT_THAT((*device)->AllocateSlab(size_bytes + (1ull << 30)),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST(HostDeviceTest, DestroyingAStreamAbandonsAWaitThatCanNeverComplete) {
  auto device = HostDevice::Create();
  ASSERT_THAT(device, IsOk());
  auto event = (*device)->CreateEvent();
  ASSERT_THAT(event, IsOk());
  auto stuck = (*device)->CreateStream(StreamPriority::kNormal);
  auto waiter = (*device)->CreateStream(StreamPriority::kNormal);
  ASSERT_THAT(stuck, IsOk());
  ASSERT_THAT(waiter, IsOk());
  // The record on `stuck` stays pending until `release` fires, like an event recorded by a client
  // process that then died.
  auto release = std::make_shared<absl::Notification>();
  ASSERT_THAT((*device)->LaunchHostFunction(**stuck, [release] { release->WaitForNotification(); }),
              IsOk());
  ASSERT_THAT((*device)->RecordEvent(**event, **stuck), IsOk());
  ASSERT_THAT((*device)->WaitEvent(**waiter, **event), IsOk());
  waiter->reset();  // must return although the wait never completes
  release->Notify();
  EXPECT_THAT((*device)->SynchronizeEvent(**event), IsOk());
}

TEST(HostDeviceTest, EventsOpenedFromOneTableShareOneMapping) {
  auto owner = HostDevice::Create();
  ASSERT_THAT(owner, IsOk());
  auto importer = HostDevice::Create();
  ASSERT_THAT(importer, IsOk());
  auto stream = (*owner)->CreateStream(StreamPriority::kNormal);
  ASSERT_THAT(stream, IsOk());
  std::vector<std::unique_ptr<Event>> owned;
  std::vector<std::unique_ptr<Event>> opened;
  for (int i = 0; i < 100; ++i) {
    auto event = (*owner)->CreateEvent();
    ASSERT_THAT(event, IsOk());
    auto imported = (*importer)->OpenEvent((*event)->handle());
    ASSERT_THAT(imported, IsOk());
    owned.push_back(*std::move(event));
    opened.push_back(*std::move(imported));
  }
  // A record through one side is visible through the other.
  auto stall = std::make_shared<absl::Notification>();
  ASSERT_THAT((*owner)->LaunchHostFunction(**stream, [stall] { stall->WaitForNotification(); }),
              IsOk());
  ASSERT_THAT((*owner)->RecordEvent(*owned[57], **stream), IsOk());
  EXPECT_THAT((*importer)->QueryEvent(*opened[57]), testing::IsOkAndHolds(false));
  EXPECT_THAT((*importer)->QueryEvent(*opened[56]), testing::IsOkAndHolds(true));
  stall->Notify();
  EXPECT_THAT((*importer)->SynchronizeEvent(*opened[57]), IsOk());
}

}  // namespace
}  // namespace tierd
