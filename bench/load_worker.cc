#include "bench/load_worker.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "bench/bench_support.h"
#include "client/tierd_client.h"

namespace tierd::bench {
namespace {

// Distinct failure messages kept per operation; the rest are only counted.
constexpr size_t kErrorsKept = 5;
// A worker whose calls fail this many times in a row stops: the session is gone or the daemon is.
constexpr int kFailuresInARowToStop = 1000;
// Exit status of a worker that gave up in a call stuck past its deadline.
constexpr int kExitStuck = 3;

// The worker's report while it runs: operations record into it from the main thread, and the
// watchdog may send it from its own thread. It is sent once.
class Recorder {
 public:
  Recorder(int worker, WorkerChannel& channel) : channel_(channel) { report_.worker = worker; }

  void SetTransport(std::string transport) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    report_.transport = std::move(transport);
  }
  void StartTimedPhase() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    report_.start_s = MonotonicSeconds();
    report_.operations.clear();
    absl::StatusOr<SchedulingTotals> scheduling = ProcessScheduling(::getpid());
    if (scheduling.ok()) scheduling_at_start_ = *scheduling;
  }
  void EndRound() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ++report_.rounds;
  }
  void Succeeded(const char* operation, std::chrono::steady_clock::duration took)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    report_.operations[operation].latency_ns.push_back(
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(took).count()));
  }
  void Failed(const char* operation, const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    OperationRecord& record = report_.operations[operation];
    ++record.failures;
    std::string message = status.ToString();
    if (record.first_errors.size() < kErrorsKept &&
        std::find(record.first_errors.begin(), record.first_errors.end(), message) ==
            record.first_errors.end()) {
      record.first_errors.push_back(std::move(message));
    }
  }

  // Sends the report with `phase` and `error` unless a final one was sent already; "ready" is not
  // final. Returns whether this call sent it.
  bool Send(const std::string& phase, const std::string& error) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (final_sent_) return false;
    report_.phase = phase;
    report_.error = error;
    if (phase != "ready") {
      final_sent_ = true;
      report_.end_s = MonotonicSeconds();
      absl::StatusOr<SchedulingTotals> scheduling = ProcessScheduling(::getpid());
      if (scheduling.ok() && scheduling_at_start_.has_value()) {
        report_.scheduling = scheduling->Since(*scheduling_at_start_);
      }
    }
    return channel_.Send(EncodeReport(report_)).ok();
  }

 private:
  WorkerChannel& channel_;
  absl::Mutex mu_;
  WorkerReport report_ ABSL_GUARDED_BY(mu_);
  bool final_sent_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<SchedulingTotals> scheduling_at_start_ ABSL_GUARDED_BY(mu_);
};

// Sends the report as "stuck" and ends the process when the timed phase runs past `deadline`
// (a call that never returns), unless stopped first.
class Watchdog {
 public:
  Watchdog(Recorder& recorder, absl::Time deadline, const std::atomic<const char*>& current)
      : thread_([this, &recorder, deadline, &current] {
          if (stop_.WaitForNotificationWithDeadline(deadline)) return;
          const char* operation = current.load();
          if (recorder.Send("stuck",
                            absl::StrCat("still in ", operation == nullptr ? "?" : operation,
                                         " at the worker's deadline"))) {
            ::_exit(kExitStuck);
          }
        }) {}
  ~Watchdog() {
    stop_.Notify();
    thread_.join();
  }

 private:
  absl::Notification stop_;
  std::thread thread_;  // last: started once stop_ exists
};

// The timed mix against one session.
class Mix {
 public:
  Mix(int worker, const LoadPlan& plan, tierd::Session& session, tierd::Stream& stream,
      const void* store_source, Recorder& recorder)
      : worker_(worker),
        plan_(plan),
        session_(session),
        stream_(stream),
        store_source_(store_source),
        recorder_(recorder) {}

  const std::atomic<const char*>& current() const { return current_; }
  // Why the worker stopped early; empty while it goes on.
  const std::string& gave_up() const { return gave_up_; }

  void Round() {
    const LoadMix& mix = plan_.mix;
    for (int i = 0; i < mix.fetches && gave_up_.empty(); ++i) {
      absl::StatusOr<tierd::Lease> lease =
          Timed("fetch", [&] { return session_.Fetch(plan_.pinned_key, stream_); });
      if (lease.ok()) lease->Release(stream_);
    }
    if (mix.hold > 0 && gave_up_.empty()) {
      std::vector<tierd::Lease> held;
      held.reserve(mix.hold);
      for (int i = 0; i < mix.hold && gave_up_.empty(); ++i) {
        absl::StatusOr<tierd::Lease> lease =
            Timed("fetch_held", [&] { return session_.Fetch(plan_.pinned_key, stream_); });
        if (lease.ok()) held.push_back(*std::move(lease));
      }
      held.clear();  // each lease releases itself on its stream
    }
    for (int i = 0; i < mix.stores && gave_up_.empty(); ++i) StoreAndFetch();
    for (int i = 0; i < mix.prefetches && gave_up_.empty() && !plan_.prefetch_keys.empty(); ++i) {
      std::vector<std::string> keys;
      for (int k = 0; k < mix.prefetch_batch; ++k) {
        keys.push_back(plan_.prefetch_keys[next_prefetch_++ % plan_.prefetch_keys.size()]);
      }
      (void)Timed("prefetch", [&] { return session_.Prefetch(keys); });
    }
  }

 private:
  void StoreAndFetch() {
    tierd::StoreRequest store;
    store.key = absl::StrCat(plan_.store_namespace, "-", worker_, "/",
                             next_store_++ % std::max(1, plan_.mix.store_keys));
    store.data = store_source_;
    store.size = plan_.mix.store_bytes;
    const absl::Status stored = Timed("store", [&]() -> absl::Status {
      absl::Status status = session_.StoreAsync(store, stream_);
      if (!status.ok()) return status;
      return session_.Flush();
    });
    if (!stored.ok()) return;
    absl::StatusOr<tierd::Lease> lease =
        Timed("fetch_stored", [&] { return session_.Fetch(store.key, stream_); });
    if (lease.ok() && lease->size() != store.size) {
      recorder_.Failed("fetch_stored",
                       absl::DataLossError(absl::StrCat(store.key, ": lease of ", lease->size(),
                                                        " bytes, stored ", store.size)));
    }
  }

  // Runs `call` (returning a Status or StatusOr) as `operation`, recording its time or failure.
  template <typename Call>
  auto Timed(const char* operation, const Call& call) -> decltype(call()) {
    current_.store(operation);
    const auto start = std::chrono::steady_clock::now();
    auto result = call();
    const auto took = std::chrono::steady_clock::now() - start;
    const absl::Status& status = StatusOf(result);
    if (status.ok()) {
      recorder_.Succeeded(operation, took);
      failures_in_a_row_ = 0;
    } else {
      recorder_.Failed(operation, status);
      if (++failures_in_a_row_ >= kFailuresInARowToStop) {
        gave_up_ =
            absl::StrCat("gave up after ", failures_in_a_row_, " failed calls in a row; the last, ",
                         operation, ": ", status.ToString());
      }
    }
    current_.store(nullptr);
    return result;
  }
  static const absl::Status& StatusOf(const absl::Status& status) { return status; }
  template <typename T>
  static const absl::Status& StatusOf(const absl::StatusOr<T>& value) {
    return value.status();
  }

  const int worker_;
  const LoadPlan& plan_;
  tierd::Session& session_;
  tierd::Stream& stream_;
  const void* const store_source_;
  Recorder& recorder_;
  std::atomic<const char*> current_{nullptr};
  std::string gave_up_;
  int failures_in_a_row_ = 0;
  uint64_t next_store_ = 0;
  uint64_t next_prefetch_ = 0;
};

// What a worker sets up before it reports ready, in the order it must be torn down.
struct Connection {
  std::unique_ptr<tierd::Client> client;
  std::unique_ptr<tierd::Session> session;
  std::unique_ptr<tierd::Stream> stream;
  std::unique_ptr<tierd::Slab> store_source;
  ~Connection() {
    // The stream and the buffer belong to the session's device: gone before the session.
    store_source.reset();
    stream.reset();
    session.reset();
  }
};

absl::Status Connect(int worker, const LoadPlan& plan, Connection& connection) {
  tierd::ClientOptions options;
  options.socket_path = plan.socket;
  options.client_name = absl::StrCat("load_bench-", worker);
  options.call_timeout = absl::Minutes(2);
  options.session_busy_poll = absl::Microseconds(plan.busy_poll_us);
  absl::StatusOr<std::unique_ptr<tierd::Client>> client = tierd::Client::Connect(options);
  if (!client.ok()) return client.status();
  connection.client = *std::move(client);
  absl::StatusOr<std::unique_ptr<tierd::Session>> session = connection.client->OpenSession();
  if (!session.ok()) return session.status();
  connection.session = *std::move(session);
  tierd::Device& device = connection.session->device();
  absl::StatusOr<std::unique_ptr<tierd::Stream>> stream =
      device.CreateStream(tierd::StreamPriority::kHigh);
  if (!stream.ok()) return stream.status();
  connection.stream = *std::move(stream);
  if (plan.mix.stores > 0) {
    absl::StatusOr<std::unique_ptr<tierd::Slab>> source = device.AllocateSlab(plan.mix.store_bytes);
    if (!source.ok()) return source.status();
    connection.store_source = *std::move(source);
  }
  if (absl::Status pinned = connection.session->Pin(plan.pinned_key); !pinned.ok()) {
    return absl::Status(pinned.code(),
                        absl::StrCat("pin ", plan.pinned_key, ": ", pinned.message()));
  }
  for (int i = 0; i < plan.warmup_fetches; ++i) {
    absl::StatusOr<tierd::Lease> lease =
        connection.session->Fetch(plan.pinned_key, *connection.stream);
    if (!lease.ok()) {
      return absl::Status(lease.status().code(),
                          absl::StrCat("warm-up fetch: ", lease.status().message()));
    }
  }
  return device.SynchronizeStream(*connection.stream);
}

}  // namespace

int RunLoadWorker(int worker, WorkerChannel& channel) {
  Recorder recorder(worker, channel);
  absl::StatusOr<std::string> plan_message = channel.Receive(absl::InfiniteFuture());
  if (!plan_message.ok()) return 1;
  const nlohmann::json plan_json = nlohmann::json::parse(*plan_message, nullptr, false);
  if (plan_json.is_discarded()) {
    recorder.Send("failed", "the plan is not JSON");
    return 1;
  }
  const LoadPlan plan = PlanFromJson(plan_json);
  Connection connection;
  if (absl::Status connected = Connect(worker, plan, connection); !connected.ok()) {
    recorder.Send("failed", absl::StrCat("setting up: ", connected.ToString()));
    return 1;
  }
  recorder.SetTransport(connection.session->transport());
  if (!recorder.Send("ready", "")) return 1;
  absl::StatusOr<std::string> go = channel.Receive(absl::InfiniteFuture());
  if (!go.ok() || *go != "go") return 1;

  recorder.StartTimedPhase();
  Mix mix(worker, plan, *connection.session, *connection.stream,
          connection.store_source == nullptr ? nullptr : connection.store_source->data(), recorder);
  const absl::Time start = absl::Now();
  const bool by_rounds = plan.rounds > 0;
  const absl::Time end = start + absl::Seconds(plan.duration_s);
  {
    Watchdog watchdog(recorder, (by_rounds ? start : end) + absl::Seconds(plan.grace_s),
                      mix.current());
    for (int64_t round = 0; mix.gave_up().empty(); ++round) {
      if (by_rounds ? round >= plan.rounds : absl::Now() >= end) break;
      mix.Round();
      recorder.EndRound();
    }
    if (absl::Status synced = connection.session->device().SynchronizeStream(*connection.stream);
        !synced.ok() && mix.gave_up().empty()) {
      recorder.Failed("fetch", synced);
    }
  }
  const bool sent = recorder.Send("done", mix.gave_up());
  // Leave the daemon as it was: the stored objects go, the pin goes with the session.
  if (plan.mix.stores > 0) {
    (void)connection.session->Evict(absl::StrCat(plan.store_namespace, "-", worker, "/"),
                                    tierd::v1::TIER_ALL);
  }
  return sent ? 0 : 1;
}

nlohmann::json PlanToJson(const LoadPlan& plan) {
  return {{"socket", plan.socket},
          {"pinned_key", plan.pinned_key},
          {"prefetch_keys", plan.prefetch_keys},
          {"store_namespace", plan.store_namespace},
          {"mix",
           {{"fetches", plan.mix.fetches},
            {"hold", plan.mix.hold},
            {"stores", plan.mix.stores},
            {"store_bytes", plan.mix.store_bytes},
            {"store_keys", plan.mix.store_keys},
            {"prefetches", plan.mix.prefetches},
            {"prefetch_batch", plan.mix.prefetch_batch}}},
          {"duration_s", plan.duration_s},
          {"rounds", plan.rounds},
          {"warmup_fetches", plan.warmup_fetches},
          {"grace_s", plan.grace_s},
          {"busy_poll_us", plan.busy_poll_us}};
}

LoadPlan PlanFromJson(const nlohmann::json& json) {
  LoadPlan plan;
  plan.socket = json.value("socket", plan.socket);
  plan.pinned_key = json.value("pinned_key", plan.pinned_key);
  plan.prefetch_keys = json.value("prefetch_keys", plan.prefetch_keys);
  plan.store_namespace = json.value("store_namespace", plan.store_namespace);
  const nlohmann::json mix = json.value("mix", nlohmann::json::object());
  plan.mix.fetches = mix.value("fetches", plan.mix.fetches);
  plan.mix.hold = mix.value("hold", plan.mix.hold);
  plan.mix.stores = mix.value("stores", plan.mix.stores);
  plan.mix.store_bytes = mix.value("store_bytes", plan.mix.store_bytes);
  plan.mix.store_keys = mix.value("store_keys", plan.mix.store_keys);
  plan.mix.prefetches = mix.value("prefetches", plan.mix.prefetches);
  plan.mix.prefetch_batch = mix.value("prefetch_batch", plan.mix.prefetch_batch);
  plan.duration_s = json.value("duration_s", plan.duration_s);
  plan.rounds = json.value("rounds", plan.rounds);
  plan.warmup_fetches = json.value("warmup_fetches", plan.warmup_fetches);
  plan.grace_s = json.value("grace_s", plan.grace_s);
  plan.busy_poll_us = json.value("busy_poll_us", plan.busy_poll_us);
  return plan;
}

std::string EncodeReport(const WorkerReport& report) {
  nlohmann::json operations = nlohmann::json::object();
  for (const auto& [name, record] : report.operations) {
    operations[name] = {{"latency_ns", record.latency_ns},
                        {"failures", record.failures},
                        {"first_errors", record.first_errors}};
  }
  nlohmann::json json = {{"worker", report.worker},   {"phase", report.phase},
                         {"error", report.error},     {"transport", report.transport},
                         {"start_s", report.start_s}, {"end_s", report.end_s},
                         {"rounds", report.rounds},   {"operations", operations}};
  if (report.scheduling.has_value()) {
    json["scheduling"] = {{"on_cpu_s", report.scheduling->on_cpu_s},
                          {"waiting_s", report.scheduling->waiting_s},
                          {"timeslices", report.scheduling->timeslices}};
  }
  const std::vector<uint8_t> bytes = nlohmann::json::to_msgpack(json);
  return std::string(bytes.begin(), bytes.end());
}

absl::StatusOr<WorkerReport> DecodeReport(const std::string& bytes) {
  const nlohmann::json json = nlohmann::json::from_msgpack(bytes, true, false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError("a worker's report is not MessagePack");
  }
  try {
    WorkerReport report;
    report.worker = json.at("worker").get<int>();
    report.phase = json.at("phase").get<std::string>();
    report.error = json.at("error").get<std::string>();
    report.transport = json.at("transport").get<std::string>();
    report.start_s = json.at("start_s").get<double>();
    report.end_s = json.at("end_s").get<double>();
    report.rounds = json.at("rounds").get<int64_t>();
    for (const auto& [name, record] : json.at("operations").items()) {
      OperationRecord& into = report.operations[name];
      into.latency_ns = record.at("latency_ns").get<std::vector<uint64_t>>();
      into.failures = record.at("failures").get<uint64_t>();
      into.first_errors = record.at("first_errors").get<std::vector<std::string>>();
    }
    if (json.contains("scheduling")) {
      const nlohmann::json& scheduling = json.at("scheduling");
      report.scheduling = SchedulingTotals{scheduling.at("on_cpu_s").get<double>(),
                                           scheduling.at("waiting_s").get<double>(),
                                           scheduling.at("timeslices").get<uint64_t>()};
    }
    return report;
  } catch (const nlohmann::json::exception& error) {
    return absl::InvalidArgumentError(absl::StrCat("a worker's report: ", error.what()));
  }
}

}  // namespace tierd::bench
