// The fixture of operations_test: a state directory, the daemon's command line, tierctl, and a
// daemon started and waited for until it serves.
#ifndef TIERD_TESTS_SYSTEM_OPERATIONS_TEST_FIXTURE_H_
#define TIERD_TESTS_SYSTEM_OPERATIONS_TEST_FIXTURE_H_

#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_test_support.h"
#include "tests/test_support.h"

namespace tierd {

class OperationsTest : public ::testing::Test {
 protected:
  static constexpr absl::Duration kTimeout = absl::Seconds(30);

  std::string socket_path() const { return absl::StrCat(dir_.path(), "/gpu0.sock"); }

  std::vector<std::string> TierdArgs(std::vector<std::string> extra = {}) const {
    std::vector<std::string> args = {testing::SiblingBinary("tierd"), "--device=host",
                                     absl::StrCat("--socket=", socket_path()),
                                     absl::StrCat("--state-dir=", dir_.path(), "/state")};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  std::string WriteFile(const std::string& name, const std::string& content) const {
    const std::string path = absl::StrCat(dir_.path(), "/", name);
    std::ofstream(path) << content;
    return path;
  }

  absl::StatusOr<testing::RunResult> Tierctl(const std::vector<std::string>& args) const {
    return testing::RunTierctl(socket_path(), args, kTimeout);
  }

  // Starts tierd with `args` and waits until its health check says SERVING.
  std::unique_ptr<testing::Subprocess> StartDaemon(const std::vector<std::string>& args) {
    auto daemon = testing::StartServingDaemon(args, socket_path(), kTimeout);
    EXPECT_THAT(daemon, testing::IsOk());
    return daemon.ok() ? *std::move(daemon) : nullptr;
  }

  // `tierctl stats --json`'s field at `path`, e.g. {"gpu", "budget_bytes"}.
  double StatsField(const std::string& gpu_or_host, const std::string& field) const {
    auto stats = Tierctl({"--json", "stats"});
    EXPECT_THAT(stats, testing::IsOk());
    if (!stats.ok()) return -1;
    const std::regex pattern("\"" + gpu_or_host + "\": \\{[^}]*\"" + field + "\": ([0-9]+)");
    std::smatch match;
    if (!std::regex_search(stats->output, match, pattern)) {
      ADD_FAILURE() << "no " << gpu_or_host << "." << field << " in " << stats->output;
      return -1;
    }
    return std::stod(match[1].str());
  }

  testing::TempDir dir_;
};

}  // namespace tierd

#endif  // TIERD_TESTS_SYSTEM_OPERATIONS_TEST_FIXTURE_H_
