// tierctl: talk to a tierd from the command line.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "client/health.h"
#include "common/command_line.h"

ABSL_FLAG(std::string, socket, "/run/tierd/gpu0.sock", "Unix socket of the tierd to talk to");
ABSL_FLAG(int, timeout_ms, 5000, "Deadline of each call");

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitBadUsage = 2;
constexpr char kUsage[] =
    "tierctl [--socket=PATH] COMMAND\n"
    "commands:\n"
    "  health   print the daemon's serving status; exit 0 only when SERVING\n";

void PrintError(const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", absl::StatusCodeToString(status.code()).c_str(),
               std::string(status.message()).c_str());
}

int Health() {
  absl::StatusOr<std::string> serving = tierd::CheckHealth(
      absl::GetFlag(FLAGS_socket), absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms)));
  if (!serving.ok()) {
    PrintError(serving.status());
    return kExitFailure;
  }
  std::printf("%s\n", serving->c_str());
  return *serving == "SERVING" ? 0 : kExitFailure;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<std::string> args = tierd::ParseCommandLineWithDashes(argc, argv);
  if (args.size() < 2) {
    std::fputs(kUsage, stderr);
    return kExitBadUsage;
  }
  const std::string command = args[1];
  if (command == "health" && args.size() == 2) return Health();
  std::fprintf(stderr, "tierctl: unknown command or arguments: %s\n%s", command.c_str(), kUsage);
  return kExitBadUsage;
}
