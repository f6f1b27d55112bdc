#include "tests/test_support.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/posix_error.h"
#include "gtest/gtest.h"

extern char** environ;

namespace tierd::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = absl::StrCat(base != nullptr ? base : "/tmp", "/tierd-test-XXXXXX");
  if (::mkdtemp(pattern.data()) == nullptr) std::abort();
  path_ = pattern;
}

TempDir::TempDir(const std::string& parent) {
  std::string pattern = absl::StrCat(parent, "/tierd-test-XXXXXX");
  if (::mkdtemp(pattern.data()) == nullptr) std::abort();
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

int64_t ResidentKiB(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoll(line.c_str() + 6, nullptr, 10);
  }
  return -1;
}

std::string SiblingBinary(const std::string& name) {
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / name).string();
}

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(
    const std::vector<std::string>& argv) {
  int to_child[2];
  int from_child[2];
  if (::pipe2(to_child, O_CLOEXEC) != 0) return PosixError("pipe", errno);
  if (::pipe2(from_child, O_CLOEXEC) != 0) return PosixError("pipe", errno);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, from_child[1], STDOUT_FILENO);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(to_child[0]);
  ::close(from_child[1]);
  if (rc != 0) {
    ::close(to_child[1]);
    ::close(from_child[0]);
    return PosixError(absl::StrCat("spawning ", argv[0]), rc);
  }
  return std::unique_ptr<Subprocess>(new Subprocess(pid, to_child[1], from_child[0]));
}

Subprocess::~Subprocess() {
  if (!exit_code_.has_value()) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (stdin_fd_ >= 0) ::close(stdin_fd_);
  ::close(stdout_fd_);
}

absl::StatusOr<std::string> Subprocess::ReadLine(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    const size_t newline = buffered_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffered_.substr(0, newline);
      buffered_.erase(0, newline + 1);
      return line;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat("no line from child; got '", buffered_, "'"));
    }
    struct pollfd pfd = {stdout_fd_, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready < 0 && errno != EINTR) return PosixError("poll", errno);
    if (ready <= 0) continue;
    char chunk[4096];
    const ssize_t n = ::read(stdout_fd_, chunk, sizeof(chunk));
    if (n < 0 && errno != EINTR) return PosixError("read", errno);
    if (n == 0)
      return absl::OutOfRangeError(absl::StrCat("child closed stdout; rest '", buffered_, "'"));
    if (n > 0) buffered_.append(chunk, static_cast<size_t>(n));
  }
}

absl::StatusOr<std::string> Subprocess::ReadAll(absl::Duration timeout) {
  std::string all;
  for (;;) {
    absl::StatusOr<std::string> line = ReadLine(timeout);
    if (line.ok()) {
      absl::StrAppend(&all, *line, "\n");
      continue;
    }
    if (line.status().code() != absl::StatusCode::kOutOfRange) return line.status();
    absl::StrAppend(&all, buffered_);
    buffered_.clear();
    return all;
  }
}

absl::Status Subprocess::WriteToStdin(const std::string& text) {
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(stdin_fd_, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return PosixError("write to child", errno);
    written += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

void Subprocess::CloseStdin() {
  if (stdin_fd_ >= 0) ::close(stdin_fd_);
  stdin_fd_ = -1;
}

void Subprocess::Signal(int signal_number) { ::kill(pid_, signal_number); }

absl::Status Subprocess::Stop(absl::Duration timeout) {
  Signal(SIGSTOP);
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t done = ::waitpid(pid_, &status, WNOHANG | WUNTRACED);
    if (done == pid_) {
      if (WIFSTOPPED(status)) return absl::OkStatus();
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return absl::FailedPreconditionError(
          absl::StrCat("pid ", pid_, " exited (", *exit_code_, ") instead of stopping"));
    }
    if (done < 0 && errno != EINTR) return PosixError("waitpid", errno);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("pid ", pid_, " has not stopped"));
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  if (exit_code_.has_value()) return *exit_code_;
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t done = ::waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return *exit_code_;
    }
    if (done < 0 && errno != EINTR) return PosixError("waitpid", errno);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("pid ", pid_, " still running"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

absl::StatusOr<RunResult> RunProgram(const std::vector<std::string>& argv, absl::Duration timeout) {
  absl::StatusOr<std::unique_ptr<Subprocess>> child = Subprocess::Start(argv);
  if (!child.ok()) return child.status();
  (*child)->CloseStdin();
  RunResult result;
  absl::StatusOr<std::string> output = (*child)->ReadAll(timeout);
  if (!output.ok()) return output.status();
  result.output = *std::move(output);
  absl::StatusOr<int> code = (*child)->Wait(timeout);
  if (!code.ok()) return code.status();
  result.exit_code = *code;
  return result;
}

absl::StatusOr<RunResult> RunProgramWithStderr(const std::vector<std::string>& argv,
                                               absl::Duration timeout,
                                               uint64_t address_space_bytes) {
  // The arguments go to the shell as $0 and $@, so none of them needs quoting.
  std::string script = "exec \"$0\" \"$@\" 2>&1";
  if (address_space_bytes != 0) {
    script = absl::StrCat("ulimit -v ", address_space_bytes / 1024, " && ", script);
  }
  std::vector<std::string> shell = {"/bin/sh", "-c", script};
  shell.insert(shell.end(), argv.begin(), argv.end());
  return RunProgram(shell, timeout);
}

namespace {

DeviceSpec g_device_under_test;

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

void FillPattern(void* data, size_t bytes, uint64_t seed) {
  auto* out = static_cast<uint8_t*>(data);
  uint64_t state = seed;
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t word = SplitMix64(state);
    std::memcpy(out + i, &word, std::min<size_t>(8, bytes - i));
  }
}

std::string PatternBytes(size_t bytes, uint64_t seed) {
  std::string data(bytes, '\0');
  FillPattern(data.data(), data.size(), seed);
  return data;
}

int64_t FirstPatternMismatch(const void* data, size_t bytes, uint64_t seed) {
  const auto* in = static_cast<const uint8_t*>(data);
  uint64_t state = seed;
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t word = SplitMix64(state);
    const size_t n = std::min<size_t>(8, bytes - i);
    if (std::memcmp(in + i, &word, n) != 0) {
      for (size_t j = 0; j < n; ++j) {
        if (in[i + j] != reinterpret_cast<const uint8_t*>(&word)[j])
          return static_cast<int64_t>(i + j);
      }
    }
  }
  return -1;
}

DeviceSpec DeviceUnderTest() { return g_device_under_test; }

int RunDeviceTestMain(int argc, char** argv, const char* device_spec) {
  ::testing::InitGoogleMock(&argc, argv);
  absl::StatusOr<DeviceSpec> parsed = ParseDeviceSpec(device_spec);
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n", parsed.status().ToString().c_str());
    return 1;
  }
  g_device_under_test = *parsed;
  const DeviceSpec spec = g_device_under_test;
  if (spec.kind == DeviceSpec::Kind::kCuda) {
    absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice(spec);
    if (!device.ok()) {
      const char* required = std::getenv("TIERD_REQUIRE_GPU");
      const bool must_run = required != nullptr && std::string(required) == "1";
      std::fprintf(stderr, "%s: %s unusable: %s\n", must_run ? "FAILED" : "SKIPPED",
                   spec.ToString().c_str(), device.status().ToString().c_str());
      return must_run ? 1 : 77;
    }
  }
  return RUN_ALL_TESTS();
}

std::string DescribeValue(const std::string& value) {
  constexpr size_t kShown = 64;
  if (value.size() <= kShown) return ::testing::PrintToString(value);
  return absl::StrCat("a string of ", value.size(), " bytes starting ",
                      ::testing::PrintToString(value.substr(0, kShown)));
}

std::string DescribeDifference(const std::string& actual, const std::string& expected) {
  const size_t common = std::min(actual.size(), expected.size());
  size_t first = 0;
  while (first < common && actual[first] == expected[first]) ++first;
  if (first == common && actual.size() == expected.size()) return "";
  return absl::StrCat(", of ", actual.size(), " bytes against ", expected.size(),
                      ", first differing at byte ", first);
}

}  // namespace tierd::testing
