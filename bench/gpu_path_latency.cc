// gpu_path_bench's latency mode.
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "bench/gpu_path_flags.h"
#include "bench/gpu_path_session.h"

namespace tierd::bench {

// ---- latency ------------------------------------------------------------------------------------

// The floor any request/answer between two processes pays on this machine: a 64-byte message to
// a child process over a Unix socket pair and the child's 64-byte answer, both sides blocking in
// read(). Microseconds per round trip.
std::vector<double> UnixSocketPingPong(int round_trips) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) Die("socketpair failed");
  char message[64] = {};
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    while (::read(fds[1], message, sizeof(message)) == sizeof(message)) {
      if (::write(fds[1], message, sizeof(message)) != sizeof(message)) break;
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::vector<double> us;
  for (int i = 0; i < round_trips; ++i) {
    const Clock::time_point start = Clock::now();
    if (::write(fds[0], message, sizeof(message)) != sizeof(message) ||
        ::read(fds[0], message, sizeof(message)) != sizeof(message)) {
      Die("ping-pong over the socket pair failed");
    }
    us.push_back(SecondsSince(start) * 1e6);
  }
  ::close(fds[0]);
  ::waitpid(child, nullptr, 0);
  return us;
}

// Fetch latencies through `session` of `key` (pinned): each fetch followed by its release; the
// same with releases batched outside the timing; and a session request the daemon answers at
// once (unpinning what is not pinned).
nlohmann::json SessionLatencies(tierd::Session& session, tierd::Stream& stream,
                                const std::string& key, int fetches) {
  const int warmup = std::max(1000, fetches / 10);
  std::vector<double> fetch_us;
  for (int i = 0; i < warmup + fetches; ++i) {
    const Clock::time_point start = Clock::now();
    tierd::Lease lease = Check(session.Fetch(key, stream), "fetch");
    const double us = SecondsSince(start) * 1e6;
    if (i >= warmup) fetch_us.push_back(us);
    lease.Release(stream);
  }
  std::vector<double> batched_us;
  std::vector<tierd::Lease> held;
  for (int i = 0; i < fetches; ++i) {
    const Clock::time_point start = Clock::now();
    held.push_back(Check(session.Fetch(key, stream), "fetch"));
    batched_us.push_back(SecondsSince(start) * 1e6);
    if (held.size() == 100) held.clear();
  }
  held.clear();
  std::vector<double> round_trip_us;
  for (int i = 0; i < fetches; ++i) {
    const Clock::time_point start = Clock::now();
    (void)session.Unpin("latency-bench/never-pinned");
    round_trip_us.push_back(SecondsSince(start) * 1e6);
  }
  Progress(absl::StrFormat(
      "latency over %s: fetch p50 %.1f us, p99 %.1f us (targets 50, 200); releases batched: p50 "
      "%.1f us, p99 %.1f us; session round trip p50 %.1f us, p99 %.1f us",
      session.transport(), Percentile(fetch_us, 0.5), Percentile(fetch_us, 0.99),
      Percentile(batched_us, 0.5), Percentile(batched_us, 0.99), Percentile(round_trip_us, 0.5),
      Percentile(round_trip_us, 0.99)));
  return {{"transport", session.transport()},
          {"fetch", LatencySummary(fetch_us)},
          {"fetch_releases_batched", LatencySummary(batched_us)},
          {"session_round_trip", LatencySummary(round_trip_us)}};
}

nlohmann::json Latency(Bench& bench) {
  const Object& object =
      *std::min_element(bench.objects().begin(), bench.objects().end(),
                        [](const Object& a, const Object& b) { return a.size < b.size; });
  Check(bench.session().Pin(object.key), "pin " + object.key);
  const int fetches = absl::GetFlag(FLAGS_fetches);
  // The session as clients get it (the session socket where the daemon has one), then one on the
  // gRPC Session stream.
  nlohmann::json sessions = nlohmann::json::array();
  sessions.push_back(SessionLatencies(bench.session(), bench.stream(), object.key, fetches));
  {
    tierd::ClientOptions options;
    options.socket_path = absl::GetFlag(FLAGS_socket);
    options.session_socket_path.clear();
    std::unique_ptr<tierd::Client> client = Check(tierd::Client::Connect(options), "connecting");
    std::unique_ptr<tierd::Session> session = Check(client->OpenSession(), "gRPC session");
    std::unique_ptr<tierd::Stream> stream =
        Check(session->device().CreateStream(tierd::StreamPriority::kHigh), "stream");
    sessions.push_back(SessionLatencies(*session, *stream, object.key, fetches));
  }
  Check(bench.session().Unpin(object.key), "unpin");
  // Context: a unary call, and the floor any request/answer between two processes pays here.
  std::vector<double> unary_us;
  for (int i = 0; i < 2000; ++i) {
    const Clock::time_point start = Clock::now();
    Check(bench.client().GetStats(), "GetStats");
    unary_us.push_back(SecondsSince(start) * 1e6);
  }
  const std::vector<double> socket_us = UnixSocketPingPong(fetches);
  Progress(absl::StrFormat(
      "latency context: unary GetStats p50 %.1f us; Unix socket ping-pong p50 %.1f us, p99 %.1f us",
      Percentile(unary_us, 0.5), Percentile(socket_us, 0.5), Percentile(socket_us, 0.99)));
  nlohmann::json result = Environment(bench);
  result.update({{"benchmark", "fetch_latency"},
                 {"object_bytes", object.size},
                 {"targets", "p50 <= 50 us, p99 <= 200 us (the first session)"},
                 {"sessions", sessions},
                 {"unary_get_stats", LatencySummary(unary_us)},
                 {"unix_socket_ping_pong", LatencySummary(socket_us)}});
  return result;
}

}  // namespace tierd::bench
