// Helpers shared by tierd's tests: status matchers, temporary directories, child processes started
// with exec (never a bare fork), and the device a test binary runs against.
#ifndef TIERD_TESTS_TEST_SUPPORT_H_
#define TIERD_TESTS_TEST_SUPPORT_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/sanitizers.h"
#include "device/device.h"
#include "device/device_factory.h"
#include "gmock/gmock.h"

namespace tierd::testing {

// EXPECT_THAT(status_or_statusor, IsOk());
MATCHER(IsOk, "is OK") {
  if constexpr (std::is_same_v<std::decay_t<arg_type>, absl::Status>) {
    *result_listener << arg;
    return arg.ok();
  } else {
    *result_listener << arg.status();
    return arg.ok();
  }
}

// A value as a failure message shows it: as gtest prints it, but a string of more than 64 bytes
// (a tensor's bytes) as its size and first bytes.
template <typename T>
std::string DescribeValue(const T& value) {
  return ::testing::PrintToString(value);
}
std::string DescribeValue(const std::string& value);

// Where two strings first differ, for a failure message.
std::string DescribeDifference(const std::string& actual, const std::string& expected);
template <typename Actual, typename Expected>
std::string DescribeDifference(const Actual&, const Expected&) {
  return "";
}

// EXPECT_THAT(statusor, IsOkAndHolds(value));
// A match prints nothing: describing a megabyte for every fetch a test checks took most of a
// sanitized test's time.
MATCHER_P(IsOkAndHolds, expected, "is OK and holds " + ::tierd::testing::DescribeValue(expected)) {
  if (!arg.ok()) {
    *result_listener << arg.status();
    return false;
  }
  if (*arg == expected) return true;
  if (result_listener->IsInterested()) {
    *result_listener << "holds " << ::tierd::testing::DescribeValue(*arg)
                     << ::tierd::testing::DescribeDifference(*arg, expected);
  }
  return false;
}

// EXPECT_THAT(status_or_statusor, StatusIs(absl::StatusCode::kNotFound));
MATCHER_P(StatusIs, code, "has status code " + absl::StatusCodeToString(code)) {
  absl::Status status;
  if constexpr (std::is_same_v<std::decay_t<arg_type>, absl::Status>) {
    status = arg;
  } else {
    status = arg.status();
  }
  *result_listener << status;
  return status.code() == code;
}

// A fresh directory, removed with its contents on destruction: under $TMPDIR (else /tmp), or
// under `parent` (/dev/shm, for files on tmpfs).
class TempDir {
 public:
  TempDir();
  explicit TempDir(const std::string& parent);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A process's resident memory (VmRSS) in KiB, from /proc; -1 when it cannot be read.
int64_t ResidentKiB(pid_t pid);

// The path of a program built next to the running test binary (all binaries share one bin/).
std::string SiblingBinary(const std::string& name);

// A child process started with posix_spawn (fork + exec), with pipes to its stdin and from its
// stdout; its stderr goes to the test's stderr. Killed (SIGKILL) on destruction if still running.
class Subprocess {
 public:
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(const std::vector<std::string>& argv);
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  // Reads one line of the child's stdout (without '\n'); DEADLINE_EXCEEDED after `timeout`,
  // OUT_OF_RANGE at end of output.
  absl::StatusOr<std::string> ReadLine(absl::Duration timeout);
  // Everything the child writes to stdout until it closes it.
  absl::StatusOr<std::string> ReadAll(absl::Duration timeout);
  absl::Status WriteToStdin(const std::string& text);
  void CloseStdin();
  void Signal(int signal_number);
  // Sends SIGSTOP and waits until every thread of the child has stopped (kill() returns before
  // they do): DEADLINE_EXCEEDED after `timeout`, FAILED_PRECONDITION when it exited instead.
  absl::Status Stop(absl::Duration timeout);
  // Waits for exit and returns the exit code (128 + signal when killed by a signal);
  // DEADLINE_EXCEEDED after `timeout`.
  absl::StatusOr<int> Wait(absl::Duration timeout);

 private:
  Subprocess(pid_t pid, int stdin_fd, int stdout_fd)
      : pid_(pid), stdin_fd_(stdin_fd), stdout_fd_(stdout_fd) {}
  pid_t pid_;
  int stdin_fd_;
  int stdout_fd_;
  std::string buffered_;
  std::optional<int> exit_code_;
};

// Runs a program to completion and collects its exit code and stdout.
struct RunResult {
  int exit_code = -1;
  std::string output;
};
absl::StatusOr<RunResult> RunProgram(const std::vector<std::string>& argv, absl::Duration timeout);
// The same with the program's stderr merged into `output`, to check its messages, and, when
// `address_space_bytes` is not 0, its address space bounded to that (ulimit -v): a program that
// should refuse to start at once cannot take the machine's memory if it does not.
absl::StatusOr<RunResult> RunProgramWithStderr(const std::vector<std::string>& argv,
                                               absl::Duration timeout,
                                               uint64_t address_space_bytes = 0);
// The bound to give RunProgramWithStderr for a program expected to refuse to start: `bytes`, or
// none under the sanitizers, whose shadow memory is reserved as terabytes of address space.
constexpr uint64_t AddressSpaceForRefusal(uint64_t bytes) {
#if TIERD_UNDER_ASAN || TIERD_UNDER_TSAN
  static_cast<void>(bytes);
  return 0;
#else
  return bytes;
#endif
}

// Deterministic pseudo-random bytes for `seed` (splitmix64), for filling and checking buffers.
void FillPattern(void* data, size_t bytes, uint64_t seed);
// `bytes` bytes of FillPattern(seed).
std::string PatternBytes(size_t bytes, uint64_t seed);
// Offset of the first byte of `data` that differs from FillPattern(seed), or -1 when all match.
int64_t FirstPatternMismatch(const void* data, size_t bytes, uint64_t seed);

// The device this test binary runs against, as given to RunDeviceTestMain.
DeviceSpec DeviceUnderTest();

// main() for test binaries that run against the device `device_spec` ("host" or "cuda:0"). A CUDA
// binary on a machine without a usable GPU exits 77, which CTest reports as skipped — unless
// TIERD_REQUIRE_GPU=1, where that is a failure.
int RunDeviceTestMain(int argc, char** argv, const char* device_spec);

}  // namespace tierd::testing

#endif  // TIERD_TESTS_TEST_SUPPORT_H_
