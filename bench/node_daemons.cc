#include "bench/node_daemons.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "bench/bench_support.h"
#include "client/health.h"
#include "common/byte_size.h"
#include "common/posix_error.h"

namespace tierd::bench {
namespace {

std::string DaemonDir(const NodeDaemonOptions& options, int index) {
  return absl::StrCat(options.work_dir, "/daemon-", index);
}

// Forks and execs `argv` with stdout and stderr appended to `log`; the child gets SIGTERM when
// this thread ends. Everything the child touches between fork and exec is made before the fork.
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& log) {
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return PosixError("fork", errno);
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);
    const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (out < 0 || null < 0) ::_exit(126);
    ::dup2(null, 0);
    ::dup2(out, 1);
    ::dup2(out, 2);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

}  // namespace

std::string NodeDaemonSocket(const NodeDaemonOptions& options, int index) {
  return DaemonDir(options, index) + "/tierd.sock";
}

absl::StatusOr<std::unique_ptr<NodeDaemons>> NodeDaemons::Start(const NodeDaemonOptions& options,
                                                                int count, bool with_peers,
                                                                const std::string& label) {
  std::vector<std::string> sockets;
  for (int i = 0; i < count; ++i) sockets.push_back(NodeDaemonSocket(options, i));
  std::unique_ptr<NodeDaemons> daemons(new NodeDaemons());
  for (int i = 0; i < count; ++i) {
    const std::string dir = DaemonDir(options, i);
    std::error_code error;
    std::filesystem::remove_all(dir + "/state", error);
    std::filesystem::remove(sockets[i], error);
    std::filesystem::create_directories(dir, error);
    if (error) return absl::InternalError(absl::StrCat("creating ", dir, ": ", error.message()));
    std::vector<std::string> argv = {options.tierd,
                                     absl::StrCat("--device=", options.devices[i]),
                                     absl::StrCat("--socket=", sockets[i]),
                                     absl::StrCat("--state-dir=", dir, "/state"),
                                     absl::StrCat("--model-roots=", options.model_root),
                                     absl::StrCat("--host-cache-bytes=", options.host_cache_bytes),
                                     absl::StrCat("--gpu-pool-bytes=", options.gpu_pool_bytes)};
    if (with_peers && count > 1) argv.push_back("--peers=" + absl::StrJoin(sockets, ","));
    argv.insert(argv.end(), options.extra_flags.begin(), options.extra_flags.end());
    Progress(absl::StrCat("daemon ", i, ": ", absl::StrJoin(argv, " ")));
    Daemon daemon;
    daemon.socket = sockets[i];
    absl::StatusOr<pid_t> pid = Spawn(argv, absl::StrCat(dir, "/", label, ".log"));
    if (!pid.ok()) return pid.status();
    daemon.pid = *pid;
    daemons->daemons_.push_back(std::move(daemon));
  }
  const absl::Time deadline = absl::Now() + options.start_timeout;
  for (int i = 0; i < count; ++i) {
    if (absl::Status status = daemons->WaitUntilServing(i, deadline); !status.ok()) {
      return absl::Status(
          status.code(),
          absl::StrCat(status.message(), " (log: ", DaemonDir(options, i), "/", label, ".log)"));
    }
    tierd::ClientOptions client;
    client.socket_path = sockets[i];
    client.client_name = "node_bench";
    client.call_timeout = absl::Minutes(10);
    absl::StatusOr<std::unique_ptr<tierd::Client>> connected = tierd::Client::Connect(client);
    if (!connected.ok()) return connected.status();
    daemons->daemons_[i].client = *std::move(connected);
  }
  for (int i = 0; i < count; ++i) {
    if (absl::Status status = daemons->WaitUntilPinned(i, deadline); !status.ok()) return status;
  }
  return daemons;
}

NodeDaemons::~NodeDaemons() { Stop(); }

absl::Status NodeDaemons::WaitUntilServing(int index, absl::Time deadline) {
  Daemon& daemon = daemons_[index];
  absl::StatusOr<std::string> health;
  while (absl::Now() < deadline) {
    int status = 0;
    if (::waitpid(daemon.pid, &status, WNOHANG) == daemon.pid) {
      daemon.pid = -1;
      return absl::UnavailableError(
          absl::StrCat("daemon ", index, " ", DescribeWaitStatus(status), " before serving"));
    }
    health = CheckHealth(daemon.socket, absl::Seconds(1));
    if (health.ok() && *health == "SERVING") return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("daemon ", index, " does not serve on ", daemon.socket,
                   "; last health: ", health.ok() ? *health : health.status().ToString()));
}

// The host cache pins in the background, and on a node each daemon registers its peers' host
// arenas in the background; their threads would compete with the loads, as they do not when a
// node's daemons start long before its models load. Done when the whole budget is pinned and the
// peers' arenas (as large as this one's, in this benchmark) are registered, or when the figures
// stop growing (the arena may round the budget).
absl::Status NodeDaemons::WaitUntilPinned(int index, absl::Time deadline) {
  uint64_t last = 0;
  absl::Time last_change = absl::Now();
  for (;;) {
    absl::StatusOr<tierd::v1::Stats> stats = daemons_[index].client->GetStats();
    if (!stats.ok()) return stats.status();
    const uint64_t peers = stats->node_daemons() > 1 ? stats->node_daemons() - 1 : 0;
    const uint64_t pinned = stats->host_pinned_bytes() + stats->node_peer_arena_bytes();
    if (pinned >= (1 + peers) * stats->host().budget_bytes()) return absl::OkStatus();
    if (pinned != last) {
      last = pinned;
      last_change = absl::Now();
    } else if (absl::Now() - last_change > absl::Seconds(3)) {
      return absl::OkStatus();
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("daemon ", index, " has pinned only ", FormatByteSize(pinned)));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

std::vector<std::string> NodeDaemons::Stop(absl::Duration grace) {
  for (Daemon& daemon : daemons_) {
    daemon.client.reset();
    if (daemon.pid > 0) ::kill(daemon.pid, SIGTERM);
  }
  std::vector<std::string> how(daemons_.size(), "not running");
  const absl::Time deadline = absl::Now() + grace;
  for (size_t i = 0; i < daemons_.size(); ++i) {
    Daemon& daemon = daemons_[i];
    if (daemon.pid <= 0) continue;
    int status = 0;
    bool killed = false;
    for (;;) {
      const pid_t done = ::waitpid(daemon.pid, &status, WNOHANG);
      if (done == daemon.pid || (done < 0 && errno != EINTR)) break;
      if (!killed && absl::Now() > deadline) {
        ::kill(daemon.pid, SIGKILL);
        killed = true;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    how[i] = DescribeWaitStatus(status) + (killed ? " (after the grace)" : "");
    daemon.pid = -1;
  }
  return how;
}

}  // namespace tierd::bench
