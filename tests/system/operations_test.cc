// tierd as an operator runs it, as a separate process on real sockets: the configuration file, the
// systemd notifications (to a fake NOTIFY_SOCKET) and the Prometheus endpoint scraped over HTTP and
// parsed. operations_access_test.cc has the rest of this binary's tests.
#include <fcntl.h>
#include <grp.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/health.h"
#include "client/tierd_client.h"
#include "common/version.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_test_support.h"
#include "tests/storage_test_support.h"
#include "tests/system/operations_test_fixture.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::tierd::testing::IsOk;
using ::tierd::testing::IsOkAndHolds;
using ::tierd::testing::RunProgram;
using ::tierd::testing::SiblingBinary;
using ::tierd::testing::StatusIs;
using ::tierd::testing::Subprocess;
using ::tierd::testing::TempDir;

// A TCP port on loopback that nothing listens on right now.
int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

// Prometheus text exposition, parsed strictly enough to catch malformed output: every sample line
// is `name{labels} value` with a TYPE line for its metric before it.
struct Exposition {
  std::map<std::string, double> samples;  // "name{labels}" -> value
  std::map<std::string, std::string> types;
  std::vector<std::string> errors;

  double at(const std::string& series) const {
    auto it = samples.find(series);
    return it == samples.end() ? -1 : it->second;
  }
};

Exposition ParseExposition(const std::string& text) {
  static const std::regex kSample(
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? (\S+)$)");
  Exposition out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, "# HELP ")) continue;
    if (absl::ConsumePrefix(&line, "# TYPE ")) {
      std::vector<std::string> parts = absl::StrSplit(line, ' ');
      if (parts.size() != 2 || (parts[1] != "gauge" && parts[1] != "counter")) {
        out.errors.push_back(std::string(line));
      }
      out.types[parts[0]] = parts.size() > 1 ? parts[1] : "";
      continue;
    }
    std::cmatch match;
    double value = 0;
    const std::string copy(line);
    if (!std::regex_match(copy.c_str(), match, kSample) ||
        !absl::SimpleAtod(match[5].str(), &value)) {
      out.errors.push_back(copy);
      continue;
    }
    if (out.types.count(match[1].str()) == 0) out.errors.push_back("no TYPE before " + copy);
    out.samples[absl::StrCat(match[1].str(), match[2].str())] = value;
  }
  return out;
}

// ---- Configuration file -------------------------------------------------------------------------

TEST_F(OperationsTest, ConfigFileSetsFlagsAndTheCommandLineWins) {
  const std::string config = WriteFile("tierd.conf",
                                       "# budgets for this node\n"
                                       "\n"
                                       "host-cache-bytes = 48MiB\n"
                                       "gpu_pool_bytes = 24MiB   # underscores work too\n"
                                       "  gpu-slab-bytes=8MiB\n"
                                       "session-socket = \"\"\n"
                                       "host-cache-policy = lru\n");
  auto daemon =
      StartDaemon(TierdArgs({absl::StrCat("--config=", config), "--gpu-pool-bytes=16MiB"}));
  ASSERT_NE(daemon, nullptr);
  EXPECT_EQ(StatsField("host", "budget_bytes"), 48 << 20);  // from the file
  EXPECT_EQ(StatsField("gpu", "budget_bytes"), 16 << 20);   // the command line won
  // session-socket = "" turned the session socket off.
  EXPECT_NE(::access(absl::StrCat(dir_.path(), "/gpu0.session.sock").c_str(), F_OK), 0);
  daemon->Signal(SIGTERM);
  EXPECT_THAT(daemon->Wait(kTimeout), IsOkAndHolds(0));
}

// The address space a daemon reading a configuration it must refuse gets, should it read on.
constexpr uint64_t kConfigAddressSpace = testing::AddressSpaceForRefusal(1ull << 30);

TEST_F(OperationsTest, BadConfigFilesAreRefusedNamingFileLineAndKey) {
  struct Case {
    std::string content;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"host-cache-bytes = 64MiB\nhost-cache-byte = 1GiB\n",
       "tierd.conf:2: unknown key \"host-cache-byte\""},
      {"gpu-pool-bytes = lots\n", "tierd.conf:1: gpu-pool-bytes = \"lots\""},
      {"reader-threads\n", "tierd.conf:1: expected KEY = VALUE"},
      {"v = 1\nv = 2\n", "tierd.conf:2: v is set twice (first on line 1)"},
      {"config = /etc/other.conf\n", "tierd.conf:1: config cannot be set in a file"},
      {"help = true\n", "unknown key \"help\""},  // only tierd's own flags
      {"metrics-address = \"127.0.0.1\n", "tierd.conf:1: metrics-address: unterminated quote"},
  };
  for (const Case& bad : cases) {
    const std::string config = WriteFile("tierd.conf", bad.content);
    // stderr is merged into the output so the message can be checked.
    auto result = RunProgram({"/bin/sh", "-c",
                              absl::StrCat(SiblingBinary("tierd"), " --config=", config,
                                           " --device=host --socket=", socket_path(),
                                           " --state-dir=", dir_.path(), "/state 2>&1")},
                             kTimeout);
    ASSERT_THAT(result, IsOk());
    EXPECT_EQ(result->exit_code, 2) << bad.content;
    EXPECT_THAT(result->output, HasSubstr(bad.message)) << bad.content;
  }
  // Files that never end, or lines that do not, are refused without reading them whole: a config
  // of /dev/zero once grew the daemon until an address-space limit stopped it at 1 GB.
  const std::string long_line =
      WriteFile("long.conf", absl::StrCat("v = ", std::string(8192, '1'), "\n"));
  const std::string big = WriteFile("big.conf", [] {
    std::string lines;
    while (lines.size() <= (1u << 20)) lines += "# a comment line of a very long file\n";
    return lines;
  }());
  const struct {
    std::string path;
    const char* message;
  } unbounded[] = {
      {"/dev/zero", "a configuration file is at most 1048576 bytes"},
      {big, "a configuration file is at most 1048576 bytes"},
      {long_line, "long.conf:1: the line is longer than 4096 bytes"},
  };
  for (const auto& file : unbounded) {
    auto result = testing::RunProgramWithStderr(TierdArgs({absl::StrCat("--config=", file.path)}),
                                                kTimeout, kConfigAddressSpace);
    ASSERT_THAT(result, IsOk());
    EXPECT_EQ(result->exit_code, 2) << file.path << ": " << result->output;
    EXPECT_THAT(result->output, HasSubstr(file.message)) << file.path;
  }
  auto missing =
      RunProgram(TierdArgs({absl::StrCat("--config=", dir_.path(), "/absent.conf")}), kTimeout);
  ASSERT_THAT(missing, IsOk());
  EXPECT_EQ(missing->exit_code, 2);
  // A value the daemon refuses when it validates its options names the key too.
  const struct {
    const char* content;
    const char* message;
  } refused_values[] = {
      {"gpu-pool-bytes = 0\n", "gpu-pool-bytes must be greater than 0"},
      {"session-busy-poll-us = 10001\n", "session-busy-poll-us must be at most 10000"},
      {"session-threads = 65\n", "session-threads must be from 0 (the default) to 64"},
      {"session-threads = -1\n", "session-threads must be from 0 (the default) to 64"},
      {"decode-scratch-mib = 55\n", "decode-scratch-mib must be from 56 to 16384, not 55"},
      {"compress-threads = 0\n", "compress-threads must be from 1 to 64, not 0"},
      // Not rounded up to 4 KiB slabs in silence.
      {"gpu-slab-bytes = 1000\n", "gpu-slab-bytes must be a positive multiple of 4096 bytes"},
      {"metrics-port = 9400\nmetrics-address = not-an-ip\n",
       "metrics-address must be an IPv4 or IPv6 address, not \"not-an-ip\""},
      // An address without a port was accepted and ignored.
      {"metrics-address = 0.0.0.0\n", "metrics-address 0.0.0.0 needs --metrics-port"},
      {"remote-streams = 0\n", "remote-streams must be 1 to 1024, not 0"},
      {"s3-attempts = 101\n", "s3-attempts must be 1 to 100, not 101"},
  };
  for (const auto& value : refused_values) {
    const std::string config = WriteFile("refused.conf", value.content);
    auto refused = RunProgram({"/bin/sh", "-c",
                               absl::StrCat(SiblingBinary("tierd"), " --config=", config,
                                            " --device=host --socket=", socket_path(),
                                            " --state-dir=", dir_.path(), "/state 2>&1")},
                              kTimeout);
    ASSERT_THAT(refused, IsOk());
    EXPECT_EQ(refused->exit_code, 2) << value.content;
    EXPECT_THAT(refused->output, HasSubstr(value.message));
  }
}

// ---- systemd ------------------------------------------------------------------------------------

// A datagram socket standing in for systemd's notification socket.
class FakeNotifySocket {
 public:
  explicit FakeNotifySocket(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::snprintf(address.sun_path, sizeof(address.sun_path), "%s", path.c_str());
    bound_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  }
  ~FakeNotifySocket() { ::close(fd_); }
  bool bound() const { return bound_; }

  // The next message, or "" after `timeout`.
  std::string Receive(absl::Duration timeout) {
    timeval tv{static_cast<time_t>(absl::ToInt64Seconds(timeout)),
               static_cast<suseconds_t>(absl::ToInt64Microseconds(timeout) % 1000000)};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buffer[4096];
    const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
    return n > 0 ? std::string(buffer, n) : "";
  }

  // Receives until a message containing `what` arrives; the messages seen, in order.
  std::vector<std::string> ReceiveUntil(const std::string& what, absl::Duration timeout) {
    std::vector<std::string> seen;
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      std::string message = Receive(absl::Milliseconds(200));
      if (message.empty()) continue;
      seen.push_back(message);
      if (absl::StrContains(message, what)) break;
    }
    return seen;
  }

 private:
  std::string path_;
  int fd_;
  bool bound_ = false;
};

// Environment variables set for the daemons this scope starts (posix_spawn passes the test's).
class ScopedEnv {
 public:
  ScopedEnv(std::vector<std::pair<std::string, std::string>> vars) : vars_(std::move(vars)) {
    for (const auto& [name, value] : vars_) ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : vars_) ::unsetenv(name.c_str());
  }

 private:
  std::vector<std::pair<std::string, std::string>> vars_;
};

TEST_F(OperationsTest, TellsSystemdWhenReadyPingsTheWatchdogAndSaysWhenStopping) {
  FakeNotifySocket systemd(absl::StrCat(dir_.path(), "/notify"));
  ASSERT_TRUE(systemd.bound());
  std::unique_ptr<Subprocess> daemon;
  {
    // WatchdogSec=1s: pings every 0.5 s. WATCHDOG_PID is the daemon's: unknown before it starts,
    // so it is left out, which systemd's protocol allows.
    ScopedEnv env(
        {{"NOTIFY_SOCKET", absl::StrCat(dir_.path(), "/notify")}, {"WATCHDOG_USEC", "1000000"}});
    auto started = Subprocess::Start(TierdArgs());
    ASSERT_THAT(started, IsOk());
    daemon = *std::move(started);
  }
  std::vector<std::string> messages = systemd.ReceiveUntil("READY=1", kTimeout);
  ASSERT_FALSE(messages.empty());
  EXPECT_THAT(messages.back(), HasSubstr("READY=1"));
  EXPECT_THAT(messages.back(), HasSubstr(absl::StrCat("STATUS=serving on ", socket_path())));
  // Once READY was sent, the daemon answers SERVING.
  EXPECT_THAT(CheckHealth(socket_path(), absl::Seconds(5)), IsOkAndHolds(std::string("SERVING")));
  // At least three pings in the next two seconds (one every half second).
  int pings = 0;
  const absl::Time until = absl::Now() + absl::Seconds(2);
  while (absl::Now() < until) {
    if (systemd.Receive(absl::Milliseconds(200)) == "WATCHDOG=1") ++pings;
  }
  EXPECT_GE(pings, 3);
  daemon->Signal(SIGTERM);
  messages = systemd.ReceiveUntil("STOPPING=1", kTimeout);
  ASSERT_FALSE(messages.empty());
  EXPECT_THAT(messages.back(), HasSubstr("STOPPING=1"));
  EXPECT_THAT(daemon->Wait(kTimeout), IsOkAndHolds(0));
}

TEST_F(OperationsTest, AWatchdogMeantForAnotherProcessIsNotPinged) {
  FakeNotifySocket systemd(absl::StrCat(dir_.path(), "/notify"));
  ASSERT_TRUE(systemd.bound());
  std::unique_ptr<Subprocess> daemon;
  {
    // WATCHDOG_PID names this test process, not the daemon.
    ScopedEnv env({{"NOTIFY_SOCKET", absl::StrCat(dir_.path(), "/notify")},
                   {"WATCHDOG_USEC", "200000"},
                   {"WATCHDOG_PID", std::to_string(::getpid())}});
    auto started = Subprocess::Start(TierdArgs());
    ASSERT_THAT(started, IsOk());
    daemon = *std::move(started);
  }
  ASSERT_THAT(systemd.ReceiveUntil("READY=1", kTimeout).back(), HasSubstr("READY=1"));
  EXPECT_EQ(systemd.Receive(absl::Seconds(1)), "");
  daemon->Signal(SIGTERM);
  EXPECT_THAT(daemon->Wait(kTimeout), IsOkAndHolds(0));
}

TEST_F(OperationsTest, AStartThatFailsTellsSystemdWhy) {
  FakeNotifySocket systemd(absl::StrCat(dir_.path(), "/notify"));
  ASSERT_TRUE(systemd.bound());
  { std::ofstream(socket_path()) << "not a socket"; }
  ScopedEnv env({{"NOTIFY_SOCKET", absl::StrCat(dir_.path(), "/notify")}});
  auto result = RunProgram(TierdArgs(), kTimeout);
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->exit_code, 1);
  const std::string message = systemd.Receive(absl::Seconds(5));
  EXPECT_THAT(message, HasSubstr("STATUS=cannot start"));
  EXPECT_THAT(message, ::testing::Not(HasSubstr("READY=1")));
}

// ---- Metrics ------------------------------------------------------------------------------------

TEST_F(OperationsTest, MetricsEndpointServesParseablePrometheusText) {
  const int port = FreeLoopbackPort();
  auto daemon = StartDaemon(TierdArgs({"--host-cache-bytes=64MiB", "--gpu-pool-bytes=32MiB",
                                       absl::StrCat("--metrics-port=", port)}));
  ASSERT_NE(daemon, nullptr);
  // Traffic through two stages (a store goes GPU -> host) and some errors.
  const std::string payload(3 << 20, 'x');
  const std::string file = WriteFile("payload.bin", payload);
  for (int i = 0; i < 3; ++i) {
    auto put = Tierctl({"put", absl::StrCat("kv/object", i), file});
    ASSERT_THAT(put, IsOk());
    ASSERT_EQ(put->exit_code, 0);
  }
  auto missing = Tierctl({"get", "kv/absent", "-o", absl::StrCat(dir_.path(), "/out")});
  ASSERT_THAT(missing, IsOk());
  EXPECT_EQ(missing->exit_code, 1);
  auto bad_key = Tierctl({"prefetch", "no-namespace"});
  ASSERT_THAT(bad_key, IsOk());
  EXPECT_EQ(bad_key->exit_code, 1);
  // Throughput is sampled once a second: wait for a sample after the stores.
  absl::SleepFor(absl::Milliseconds(2500));

  httplib::Client http("127.0.0.1", port);
  auto response = http.Get("/metrics");
  ASSERT_TRUE(response) << httplib::to_string(response.error());
  EXPECT_EQ(response->status, 200);
  EXPECT_THAT(response->get_header_value("Content-Type"), HasSubstr("text/plain; version=0.0.4"));
  const Exposition metrics = ParseExposition(response->body);
  EXPECT_THAT(metrics.errors, ::testing::IsEmpty());
  EXPECT_EQ(metrics.at("tierd_serving"), 1);
  EXPECT_EQ(metrics.at("tierd_device_info{device=\"host\"}"), 1);
  EXPECT_EQ(metrics.at(absl::StrCat("tierd_build_info{version=\"", Version(), "\"}")), 1);
  EXPECT_EQ(metrics.at("tierd_tier_budget_bytes{tier=\"gpu\"}"), 32 << 20);
  EXPECT_EQ(metrics.at("tierd_tier_budget_bytes{tier=\"host\"}"), 64 << 20);
  EXPECT_EQ(metrics.at("tierd_stored_objects"), 3);
  EXPECT_GE(metrics.at("tierd_tier_used_bytes{tier=\"host\"}"), 3 * payload.size());
  EXPECT_EQ(metrics.at("tierd_stage_bytes_total{stage=\"gpu_to_host\"}"), 3 * payload.size());
  EXPECT_GT(metrics.at("tierd_stage_throughput_bytes_per_second{stage=\"gpu_to_host\"}"), 0);
  EXPECT_EQ(metrics.at("tierd_stage_bytes_total{stage=\"disk_to_host\"}"), 0);
  EXPECT_GE(metrics.at("tierd_requests_total{code=\"OK\"}"), 3);
  EXPECT_GE(metrics.at("tierd_requests_total{code=\"NOT_FOUND\"}"), 1);
  EXPECT_GE(metrics.at("tierd_requests_total{code=\"INVALID_ARGUMENT\"}"), 1);
  EXPECT_EQ(metrics.at("tierd_requests_total{code=\"DATA_LOSS\"}"), 0);
  EXPECT_EQ(metrics.at("tierd_checksum_failures_total"), 0);
  EXPECT_EQ(metrics.at("tierd_sessions"), 0);
  EXPECT_EQ(metrics.at("tierd_leases"), 0);
  for (const char* gauge : {"tierd_disk_reads_in_flight", "tierd_copies_in_flight",
                            "tierd_gpu_allocation_waiters", "tierd_models", "tierd_pins"}) {
    EXPECT_EQ(metrics.types.count(gauge), 1u) << gauge;
  }
  EXPECT_EQ(metrics.types.at("tierd_tier_hits_total"), "counter");
  EXPECT_EQ(http.Get("/")->status, 404);

  daemon->Signal(SIGTERM);
  EXPECT_THAT(daemon->Wait(kTimeout), IsOkAndHolds(0));
}

TEST_F(OperationsTest, ABadMetricsAddressOrPortIsRefused) {
  auto refused = RunProgram(TierdArgs({"--metrics-port=9", "--metrics-address=192.0.2.1"}),
                            kTimeout);  // TEST-NET-1
  ASSERT_THAT(refused, IsOk());
  EXPECT_EQ(refused->exit_code, 1);
  auto bad_port = RunProgram(TierdArgs({"--metrics-port=70000"}), kTimeout);
  ASSERT_THAT(bad_port, IsOk());
  EXPECT_EQ(bad_port->exit_code, 2);
}

}  // namespace
}  // namespace tierd
