// gpu_path_bench's latency mode.
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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
      "latency over %s: fetch p50 %.1f us, p99 %.1f us (targets 25, 100); releases batched: p50 "
      "%.1f us, p99 %.1f us; session round trip p50 %.1f us, p99 %.1f us",
      session.transport(), Percentile(fetch_us, 0.5), Percentile(fetch_us, 0.99),
      Percentile(batched_us, 0.5), Percentile(batched_us, 0.99), Percentile(round_trip_us, 0.5),
      Percentile(round_trip_us, 0.99)));
  return {{"transport", session.transport()},
          {"fetch", LatencySummary(fetch_us)},
          {"fetch_releases_batched", LatencySummary(batched_us)},
          {"session_round_trip", LatencySummary(round_trip_us)}};
}

// A step of a model with one object per layer, all on the GPU (pinned): `keys` fetched one
// Fetch (one round trip) at a time, the last step's leases released as it goes, against one
// FetchMany per step that releases the last step's leases in the same write. Microseconds per
// step.
nlohmann::json StepLatencies(tierd::Session& session, tierd::Stream& stream,
                             const std::vector<std::string>& keys, int steps) {
  const int warmup = std::max(20, steps / 10);
  std::vector<double> one_by_one_us;
  std::vector<tierd::Lease> held;
  for (int step = 0; step < warmup + steps; ++step) {
    const Clock::time_point start = Clock::now();
    std::vector<tierd::Lease> leases;
    for (size_t i = 0; i < keys.size(); ++i) {
      leases.push_back(Check(session.Fetch(keys[i], stream), "fetch"));
      if (i < held.size()) held[i].Release(stream);
    }
    held = std::move(leases);
    if (step >= warmup) one_by_one_us.push_back(SecondsSince(start) * 1e6);
  }
  std::vector<double> fetch_many_us;
  for (int step = 0; step < warmup + steps; ++step) {
    const Clock::time_point start = Clock::now();
    held = Check(session.FetchMany(keys, stream, std::move(held)), "fetch many");
    if (step >= warmup) fetch_many_us.push_back(SecondsSince(start) * 1e6);
  }
  held.clear();
  Progress(absl::StrFormat(
      "a step of %zu layers over %s: one Fetch per layer p50 %.1f us (%.1f us a layer), FetchMany "
      "p50 %.1f us (%.1f us a layer), %.2fx",
      keys.size(), session.transport(), Percentile(one_by_one_us, 0.5),
      Percentile(one_by_one_us, 0.5) / keys.size(), Percentile(fetch_many_us, 0.5),
      Percentile(fetch_many_us, 0.5) / keys.size(),
      Percentile(one_by_one_us, 0.5) / Percentile(fetch_many_us, 0.5)));
  return {{"transport", session.transport()},
          {"layers", keys.size()},
          {"one_fetch_per_layer", LatencySummary(one_by_one_us)},
          {"fetch_many", LatencySummary(fetch_many_us)}};
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
  // A step of --step-layers layers: the smallest objects, pinned.
  std::vector<Object> by_size = bench.objects();
  std::sort(by_size.begin(), by_size.end(),
            [](const Object& a, const Object& b) { return a.size < b.size; });
  by_size.resize(std::min<size_t>(by_size.size(), absl::GetFlag(FLAGS_step_layers)));
  std::vector<std::string> layer_keys;
  for (const Object& layer : by_size) {
    Check(bench.session().Pin(layer.key), "pin " + layer.key);
    layer_keys.push_back(layer.key);
  }
  const nlohmann::json step = StepLatencies(bench.session(), bench.stream(), layer_keys,
                                            std::max(100, fetches / 100));
  for (const std::string& key : layer_keys) Check(bench.session().Unpin(key), "unpin " + key);
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
                 {"targets", "p50 <= 25 us, p99 <= 100 us (the first session)"},
                 {"sessions", sessions},
                 {"step", step},
                 {"unary_get_stats", LatencySummary(unary_us)},
                 {"unix_socket_ping_pong", LatencySummary(socket_us)}});
  return result;
}

}  // namespace tierd::bench
