// FileSemaphore: at most `count` holders at once, across threads and processes; a slot comes free
// when its holder lets go or dies; links and other users' files are refused.
#include "common/file_semaphore.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;

TEST(FileSemaphoreTest, NoMoreThanCountThreadsHoldASlotAtOnce) {
  testing::TempDir dir;
  absl::StatusOr<std::unique_ptr<FileSemaphore>> semaphore =
      FileSemaphore::Open(absl::StrCat(dir.path(), "/slots"), 3);
  ASSERT_THAT(semaphore, IsOk());
  std::atomic<int> holding{0};
  std::atomic<int> most{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20; ++i) {
        absl::StatusOr<FileSemaphore::Slot> slot = (*semaphore)->Acquire();
        ASSERT_THAT(slot, IsOk());
        const int now = ++holding;
        for (int seen = most.load(); now > seen && !most.compare_exchange_weak(seen, now);) {
        }
        absl::SleepFor(absl::Microseconds(500));
        --holding;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(most.load(), 3);
}

TEST(FileSemaphoreTest, SlotsHeldByAnotherProcessComeFreeWhenItDies) {
  testing::TempDir dir;
  const std::string path = absl::StrCat(dir.path(), "/slots");
  absl::StatusOr<std::unique_ptr<FileSemaphore>> semaphore = FileSemaphore::Open(path, 2);
  ASSERT_THAT(semaphore, IsOk());
  int held[2];
  ASSERT_EQ(::pipe(held), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // takes both slots, says so, and dies holding them
    std::vector<FileSemaphore::Slot> slots;
    for (int i = 0; i < 2; ++i) {
      absl::StatusOr<FileSemaphore::Slot> slot = (*semaphore)->Acquire();
      if (!slot.ok()) ::_exit(1);
      slots.push_back(*std::move(slot));
    }
    if (::write(held[1], "h", 1) != 1) ::_exit(2);
    ::sleep(1);
    ::_exit(0);
  }
  char byte;
  ASSERT_EQ(::read(held[0], &byte, 1), 1);
  const absl::Time asked = absl::Now();
  absl::StatusOr<FileSemaphore::Slot> slot = (*semaphore)->Acquire();
  ASSERT_THAT(slot, IsOk());
  EXPECT_GE(absl::Now() - asked, absl::Milliseconds(500));  // only once the child was gone
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ::close(held[0]);
  ::close(held[1]);
}

TEST(FileSemaphoreTest, LinksDirectoriesAndBadCountsAreRefused) {
  testing::TempDir dir;
  const std::string target = absl::StrCat(dir.path(), "/target");
  const std::string link = absl::StrCat(dir.path(), "/link");
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  EXPECT_FALSE(FileSemaphore::Open(link, 4).ok());
  EXPECT_FALSE(FileSemaphore::Open(dir.path(), 4).ok());
  EXPECT_THAT(FileSemaphore::Open(target, 0), StatusIs(absl::StatusCode::kInvalidArgument));
  absl::StatusOr<std::unique_ptr<FileSemaphore>> opened = FileSemaphore::Open(target, 4);
  ASSERT_THAT(opened, IsOk());
  struct stat status = {};
  ASSERT_EQ(::stat(target.c_str(), &status), 0);
  EXPECT_EQ(status.st_mode & 0777, 0600u);
}

}  // namespace
}  // namespace tierd
