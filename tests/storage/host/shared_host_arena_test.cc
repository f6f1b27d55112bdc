// The host arena as POSIX shared memory (HostArenaOptions::shared): its name lives as long as the
// arena, other mappings (in this process and in another) see the bytes written through it, its
// pieces are registered as a private arena's are, and a /dev/shm too small for it fails a piece
// with RESOURCE_EXHAUSTED instead of killing the process with SIGBUS.
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "device/host_device.h"
#include "device/shared_memory.h"
#include "gtest/gtest.h"
#include "storage/host/host_arena.h"
#include "tests/registration_recording_device.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOk;
using ::tierd::testing::RegistrationRecordingDevice;
using ::tierd::testing::StatusIs;

constexpr uint64_t kMiB = 1 << 20;
constexpr absl::Duration kTimeout = absl::Seconds(30);

bool ShmObjectExists(const std::string& name) {
  return ::access(absl::StrCat("/dev/shm", name).c_str(), F_OK) == 0;
}

// Runs `child` in a forked process and returns its exit code; -1 when it was killed (the signal
// is reported as a test failure).
template <typename Child>
int RunInChild(Child child) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(child());
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  if (WIFSIGNALED(status)) {
    ADD_FAILURE() << "the child died of signal " << WTERMSIG(status) << " ("
                  << ::strsignal(WTERMSIG(status)) << ")";
    return -1;
  }
  return WEXITSTATUS(status);
}

class SharedHostArenaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = HostDevice::Create();
    ASSERT_THAT(device, IsOk());
    host_ = *std::move(device);
  }

  static HostArenaOptions SharedOptions(uint64_t bytes) {
    HostArenaOptions options{bytes, kMiB, /*pin_threads=*/2};
    options.shared = true;
    return options;
  }

  std::unique_ptr<HostDevice> host_;
};

TEST_F(SharedHostArenaTest, ItsNameExistsUnderDevShmWhileTheArenaLives) {
  std::string name;
  {
    auto arena = HostArena::Create(*host_, SharedOptions(4 * kMiB));
    ASSERT_THAT(arena, IsOk());
    name = (*arena)->shared_memory_name();
    EXPECT_EQ(name, SharedMemoryPrefixForPid(::getpid()) + "arena");
    EXPECT_TRUE(ShmObjectExists(name));
    // One shared arena per process: the name is taken.
    EXPECT_THAT(HostArena::Create(*host_, SharedOptions(4 * kMiB)),
                StatusIs(absl::StatusCode::kAlreadyExists));
    EXPECT_TRUE((*arena)->WaitUntilFullyPinned(kTimeout));
  }
  EXPECT_FALSE(ShmObjectExists(name));

  auto unshared = HostArena::Create(*host_, {4 * kMiB, kMiB});
  ASSERT_THAT(unshared, IsOk());
  EXPECT_EQ((*unshared)->shared_memory_name(), "");
}

TEST_F(SharedHostArenaTest, CreatingOneRemovesAnArenaLeftByAProcessThatNoLongerRuns) {
  // The pid of a process that has exited (and been reaped), as a crashed daemon's would be.
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);
  const std::string left_behind = SharedMemoryPrefixForPid(gone) + "arena";
  // Any process creating a shared arena sweeps what dead ones left, so another test's daemon
  // starting beside this one (ctest --parallel) may remove the object between its creation and
  // the check: plant it again until it is seen in place (the sweep takes milliseconds).
  std::unique_ptr<SharedMemory> leftover;
  bool planted = false;
  for (int attempt = 0; attempt < 20 && !planted; ++attempt) {
    leftover.reset();  // its name was swept: unlinking it again finds nothing
    auto created = SharedMemory::Create(left_behind, kMiB);
    ASSERT_THAT(created, IsOk());
    leftover = *std::move(created);
    planted = ShmObjectExists(left_behind);
  }
  ASSERT_TRUE(planted);

  auto arena = HostArena::Create(*host_, SharedOptions(4 * kMiB));
  ASSERT_THAT(arena, IsOk());
  EXPECT_FALSE(ShmObjectExists(left_behind));
  EXPECT_TRUE(ShmObjectExists((*arena)->shared_memory_name()));
}

TEST_F(SharedHostArenaTest, BytesWrittenThroughTheArenaAreReadThroughAnotherMapping) {
  auto arena = HostArena::Create(*host_, SharedOptions(4 * kMiB));
  ASSERT_THAT(arena, IsOk());
  ASSERT_TRUE((*arena)->WaitUntilFullyPinned(kTimeout));
  std::optional<ArenaAllocation> block = (*arena)->Allocate(3 * kMiB);
  ASSERT_TRUE(block.has_value());
  testing::FillPattern((*arena)->data(*block), block->size(), /*seed=*/17);

  auto reader = SharedMemory::OpenReadOnly((*arena)->shared_memory_name());
  ASSERT_THAT(reader, IsOk());
  EXPECT_TRUE((*reader)->read_only());
  EXPECT_EQ((*reader)->size(), (*arena)->capacity());
  EXPECT_NE((*reader)->data(), (*arena)->base());
  const uint8_t* seen = static_cast<const uint8_t*>((*reader)->data()) + block->offset();
  EXPECT_EQ(testing::FirstPatternMismatch(seen, block->size(), 17), -1);

  // Another process maps it by name and sees the same bytes.
  const std::string name = (*arena)->shared_memory_name();
  const uint64_t offset = block->offset();
  const uint64_t size = block->size();
  EXPECT_EQ(RunInChild([&name, offset, size] {
              auto mapped = SharedMemory::OpenReadOnly(name);
              if (!mapped.ok()) return 2;
              const uint8_t* bytes = static_cast<const uint8_t*>((*mapped)->data()) + offset;
              return testing::FirstPatternMismatch(bytes, size, 17) == -1 ? 0 : 1;
            }),
            0);

  // And the child's view is live: bytes written after the fork are there too.
  testing::FillPattern((*arena)->data(*block), kMiB, /*seed=*/23);
  EXPECT_EQ(RunInChild([&name, offset] {
              auto mapped = SharedMemory::OpenReadOnly(name);
              if (!mapped.ok()) return 2;
              const uint8_t* bytes = static_cast<const uint8_t*>((*mapped)->data()) + offset;
              return testing::FirstPatternMismatch(bytes, kMiB, 23) == -1 ? 0 : 1;
            }),
            0);
}

TEST_F(SharedHostArenaTest, EveryPieceIsRegisteredOnceAndUnregisteredWhenTheArenaGoes) {
  RegistrationRecordingDevice device(*host_);
  uint8_t* base = nullptr;
  {
    auto arena = HostArena::Create(device, SharedOptions(6 * kMiB));
    ASSERT_THAT(arena, IsOk());
    ASSERT_TRUE((*arena)->WaitUntilFullyPinned(kTimeout));
    EXPECT_THAT((*arena)->pin_status(), IsOk());
    base = (*arena)->base();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(base) % (2 * kMiB), 0u);  // huge page aligned
    std::map<const void*, int> expected;
    for (uint64_t offset = 0; offset < 6 * kMiB; offset += kMiB) expected[base + offset] = 1;
    EXPECT_EQ(device.writable_registered(), expected);
    EXPECT_TRUE(device.unregistered().empty());
  }
  EXPECT_EQ(device.unregistered(), device.registered());
  EXPECT_EQ(device.unregistered().size(), 6u);
}

// The exit code of a child that cannot make the namespaces it needs; says why on stderr.
int NamespacesUnavailable(const char* step) {
  std::perror(step);
  return 77;
}

// In a child process of its own user and mount namespaces, /dev/shm is a tmpfs of 4 MiB: a shared
// arena of 8 MiB pins what fits and fails the next piece, and one whose first piece does not fit
// is not created. Exit codes: 0 passed, 77 namespaces unavailable, others name the failed check.
int ArenaOnATinyDevShm() {
  // Our ids as the parent namespace knows them: inside, unmapped, they read as the overflow ids.
  const std::string uid_map = absl::StrCat("0 ", ::getuid(), " 1");
  const std::string gid_map = absl::StrCat("0 ", ::getgid(), " 1");
  if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) return NamespacesUnavailable("unshare");
  const std::pair<const char*, std::string> id_maps[] = {{"/proc/self/uid_map", uid_map},
                                                         {"/proc/self/setgroups", "deny"},
                                                         {"/proc/self/gid_map", gid_map}};
  for (const auto& [path, text] : id_maps) {
    std::ofstream file(path);
    file << text;
    file.close();
    if (!file) return NamespacesUnavailable(path);
  }
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return NamespacesUnavailable("making / private");
  }
  if (::mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=4m") != 0) {
    return NamespacesUnavailable("mounting a tmpfs of 4 MiB on /dev/shm");
  }

  auto device = HostDevice::Create();
  if (!device.ok()) return 10;
  HostArenaOptions options{8 * kMiB, kMiB, /*pin_threads=*/1};
  options.shared = true;
  {
    auto arena = HostArena::Create(**device, options);
    if (!arena.ok()) return 11;
    if ((*arena)->WaitUntilFullyPinned(kTimeout)) return 12;
    if ((*arena)->pin_status().code() != absl::StatusCode::kResourceExhausted) return 13;
    if ((*arena)->pinned_bytes() == 0 || (*arena)->pinned_bytes() > 4 * kMiB) return 14;
    // What was pinned is usable, to the last byte.
    std::optional<ArenaAllocation> all = (*arena)->Allocate((*arena)->pinned_bytes());
    if (!all.has_value()) return 15;
    std::memset((*arena)->data(*all), 0xab, all->size());
  }
  options.pin_piece_bytes = 8 * kMiB;
  absl::StatusOr<std::unique_ptr<HostArena>> too_big = HostArena::Create(**device, options);
  if (too_big.status().code() != absl::StatusCode::kResourceExhausted) return 16;
  // Nothing is left behind in /dev/shm.
  if (ShmObjectExists(SharedMemoryPrefixForPid(::getpid()) + "arena")) return 17;
  return 0;
}

TEST_F(SharedHostArenaTest, ADevShmTooSmallFailsAPieceWithResourceExhaustedNotSigbus) {
  const int result = RunInChild(ArenaOnATinyDevShm);
  if (result == 77) GTEST_SKIP() << "no user and mount namespaces here to make a small /dev/shm";
  EXPECT_EQ(result, 0) << "check " << result << " of ArenaOnATinyDevShm failed";
}

}  // namespace
}  // namespace tierd
