// Retained sets through a daemon process: objects kept on the GPU beyond their sessions and under
// eviction pressure, the budget, time to live, sleep and wake (in place, and under readers), and a
// daemon restart.
#include <atomic>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/system/api_test_fixture.h"

namespace tierd {
namespace api_test {
namespace {

template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& result) {
  return result.status();
}

MATCHER_P2(FailsWith, code, words,
           absl::StrCat("fails ", absl::StatusCodeToString(code), " saying \"", words, "\"")) {
  const absl::Status status = StatusOf(arg);
  *result_listener << "which is " << status;
  return status.code() == code && absl::StrContains(status.message(), words);
}

// The fixture's pool is 2 MiB of 512 KiB objects; the default budget is half of it: two objects.
class ApiRetainedTest : public ApiTest {
 protected:
  std::unique_ptr<Session> Open() {
    auto session = client_->OpenSession();
    EXPECT_THAT(session, IsOk());
    return session.ok() ? *std::move(session) : nullptr;
  }

  // Fetches and releases every block but those in `skip`, `rounds` times: the pool (four objects)
  // is emptied of whatever can be evicted.
  void StreamOtherBlocks(Session& session, const std::set<int>& skip, int rounds) {
    for (int round = 0; round < rounds; ++round) {
      for (int block = 0; block < kBlocks; ++block) {
        if (skip.count(block) > 0) continue;
        auto lease = session.Fetch(Key(block));
        ASSERT_THAT(lease, IsOk()) << Key(block);
        ExpectTensorsMatch(session, *lease);
        lease->Release();
        ASSERT_THAT(session.device().SynchronizeStream(session.default_stream()), IsOk());
      }
    }
  }

  bool OnGpu(const std::string& key) {
    auto objects = client_->ListObjects("m");
    EXPECT_THAT(objects, IsOk());
    if (!objects.ok()) return false;
    for (const v1::ObjectInfo& object : *objects) {
      if (object.key() == key) return object.on_gpu();
    }
    return false;
  }

  // Stops the daemon (SIGTERM, exit 0), runs `while_stopped`, starts it again on the same state
  // directory and connects client_ to it.
  void RestartDaemon(const std::function<void()>& while_stopped = [] {}) {
    client_.reset();
    daemon_->Signal(SIGTERM);
    ASSERT_THAT(daemon_->Wait(kTimeout), ::tierd::testing::IsOkAndHolds(0));
    while_stopped();
    daemon_ = StartDaemon();
    ASSERT_NE(daemon_, nullptr);
    ClientOptions options;
    options.socket_path = socket_path();
    auto client = Client::Connect(options);
    ASSERT_THAT(client, IsOk());
    client_ = *std::move(client);
  }

  // Sleeps `target`, retrying while a lease just released is still being drained.
  absl::StatusOr<v1::RetainedSet> SleepOnceReleased(Session& session, const std::string& target) {
    const absl::Time deadline = absl::Now() + kTimeout;
    while (true) {
      absl::StatusOr<v1::RetainedSet> slept = session.Sleep(target);
      if (!absl::IsFailedPrecondition(slept.status()) || absl::Now() > deadline) return slept;
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
};

TEST_F(ApiRetainedTest, ARetainedObjectOutlivesItsSessionAndEvictionPressure) {
  {
    std::unique_ptr<Session> session = Open();
    auto retained = session->Retain(Key(0));
    ASSERT_THAT(retained, IsOk());
    EXPECT_EQ(retained->objects(), 1u);
    EXPECT_EQ(retained->bytes(), 2 * kRows * kCols * 4);
    EXPECT_FALSE(retained->asleep());
    ASSERT_THAT(session->Fetch(Key(0)), IsOk());
  }
  {
    // Other objects, twice the pool, go through it after the session that retained it ended.
    std::unique_ptr<Session> session = Open();
    StreamOtherBlocks(*session, {0}, 2);
  }
  EXPECT_TRUE(OnGpu(Key(0)));
  const v1::Stats before = Stats();
  std::unique_ptr<Session> session = Open();
  auto lease = session->Fetch(Key(0));
  ASSERT_THAT(lease, IsOk());
  // The same GPU copy, not a new one. (A new session maps the slab again, maybe elsewhere in this
  // process: its address says nothing.)
  EXPECT_EQ(Stats().gpu().misses(), before.gpu().misses());
  EXPECT_EQ(Stats().gpu().hits(), before.gpu().hits() + 1);
  ExpectTensorsMatch(*session, *lease);
  lease->Release();
  const v1::Stats stats = Stats();
  EXPECT_EQ(stats.retained_sets(), 1u);
  EXPECT_EQ(stats.retained_bytes(), 2 * kRows * kCols * 4);
  EXPECT_EQ(stats.retain_budget_bytes(), 1u << 20);
}

TEST_F(ApiRetainedTest, MapModelNeedsALeaseForEveryObject) {
  // The fixture's session quota is three leases: a model of eight objects needs more.
  std::unique_ptr<Session> session = Open();
  EXPECT_THAT(client_->MapModel(*session, "m", session->default_stream()),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(client_->MapModel(*session, "no-such-model", session->default_stream()),
              StatusIs(absl::StatusCode::kNotFound));
}

class ApiMappedModelTest : public ApiRetainedTest {
 protected:
  ApiMappedModelTest() {
    extra_args_ = {"--session-max-leases=16", "--gpu-pool-bytes=4MiB", "--retain-bytes=4MiB"};
  }
};

TEST_F(ApiMappedModelTest, MapModelLeasesEveryObjectOfARetainedModel) {
  std::unique_ptr<Session> session = Open();
  ASSERT_THAT(session->Retain("m"), IsOk());
  auto mapped = client_->MapModel(*session, "m", session->default_stream());
  ASSERT_THAT(mapped, IsOk());
  ASSERT_EQ(mapped->size(), static_cast<size_t>(kBlocks));
  for (int block = 0; block < kBlocks; ++block) {
    EXPECT_EQ((*mapped)[block].key(), Key(block));
    ExpectTensorsMatch(*session, (*mapped)[block]);
  }
  // Retain loaded them (pins are not fetches): every fetch found its object on the GPU.
  EXPECT_EQ(Stats().gpu().misses(), 0u);
  EXPECT_EQ(Stats().gpu().hits(), static_cast<uint64_t>(kBlocks));
}

TEST_F(ApiRetainedTest, PastTheBudgetIsRefusedAndOthersStillStream) {
  std::unique_ptr<Session> session = Open();
  ASSERT_THAT(session->Retain(Key(0)), IsOk());
  ASSERT_THAT(session->Retain(Key(1)), IsOk());
  EXPECT_THAT(session->Retain(Key(2)),
              FailsWith(absl::StatusCode::kResourceExhausted, "--retain-bytes"));
  EXPECT_THAT(session->Retain("m"),
              FailsWith(absl::StatusCode::kResourceExhausted, "budget"));
  auto listed = session->ListRetained();
  ASSERT_THAT(listed, IsOk());
  EXPECT_EQ(listed->sets_size(), 2);
  EXPECT_EQ(listed->bytes(), listed->budget_bytes());
  // The other half of the pool still serves everything else.
  StreamOtherBlocks(*session, {0, 1}, 2);
  ASSERT_THAT(session->Unretain(Key(1)), IsOk());
  EXPECT_THAT(session->Retain(Key(2)), IsOk());
}

TEST_F(ApiRetainedTest, BadTargetsAreRefusedByName) {
  std::unique_ptr<Session> session = Open();
  EXPECT_THAT(session->Retain("no-such-model"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(session->Retain("m/blocks.99"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(session->Retain(""),
              FailsWith(absl::StatusCode::kInvalidArgument, "retain.target"));
  EXPECT_THAT(session->Retain("m\nx"),
              FailsWith(absl::StatusCode::kInvalidArgument, "control character"));
  EXPECT_THAT(session->Retain("nothing-stored/"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(session->Unretain(Key(0)), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(session->Sleep(Key(0)), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(session->Wake(Key(0)), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(ApiRetainedTest, SleepIsRefusedWhileLeasedAndWakeComesBackInPlace) {
  std::unique_ptr<Session> session = Open();
  ASSERT_THAT(session->Retain(Key(0)), IsOk());
  auto lease = session->Fetch(Key(0));
  ASSERT_THAT(lease, IsOk());
  const void* place = lease->data();
  EXPECT_THAT(session->Sleep(Key(0)),
              FailsWith(absl::StatusCode::kFailedPrecondition, "leased"));
  lease->Release();
  auto slept = SleepOnceReleased(*session, Key(0));
  ASSERT_THAT(slept, IsOk());
  EXPECT_TRUE(slept->asleep());
  EXPECT_FALSE(OnGpu(Key(0)));
  EXPECT_EQ(Stats().retained_bytes(), 0u);
  EXPECT_THAT(session->Retain(Key(0)),
              FailsWith(absl::StatusCode::kFailedPrecondition, "asleep"));
  auto woken = session->Wake(Key(0));
  ASSERT_THAT(woken, IsOk());
  EXPECT_FALSE(woken->asleep());
  EXPECT_EQ(woken->moved(), 0u);
  auto again = session->Fetch(Key(0));
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->data(), place) << "woken at the device address it had";
  ExpectTensorsMatch(*session, *again);
}

TEST_F(ApiRetainedTest, ASleepRightAfterItsLoadAnswersOnceTheStagingIsFree) {
  std::unique_ptr<Session> session = Open();
  for (int round = 0; round < 5; ++round) {
    ASSERT_THAT(session->Retain(Key(0)), IsOk());
    // The copies into staging may still run: the answer waits for them, then the room is free.
    auto slept = session->Sleep(Key(0));
    ASSERT_THAT(slept, IsOk());
    EXPECT_FALSE(OnGpu(Key(0))) << round;
    EXPECT_EQ(Stats().gpu().used_bytes(), 0u) << round;
    ASSERT_THAT(session->Unretain(Key(0)), IsOk());
  }
}

TEST_F(ApiRetainedTest, AWakeWhoseRoomWasTakenMovesAndStillServesTheRightBytes) {
  std::unique_ptr<Session> session = Open();
  ASSERT_THAT(session->Retain(Key(0)), IsOk());
  auto lease = session->Fetch(Key(0));
  ASSERT_THAT(lease, IsOk());
  const void* place = lease->data();
  lease->Release();
  ASSERT_THAT(SleepOnceReleased(*session, Key(0)), IsOk());
  // Hold four other objects, from two sessions (three leases each at most): the whole pool, the
  // range the set had included.
  std::unique_ptr<Session> second = Open();
  std::vector<Lease> held;
  for (int block = 1; block <= 4; ++block) {
    auto other = (block <= 3 ? *session : *second).Fetch(Key(block));
    ASSERT_THAT(other, IsOk());
    held.push_back(*std::move(other));
  }
  EXPECT_THAT(session->Wake(Key(0)), StatusIs(absl::StatusCode::kResourceExhausted));
  auto listed = session->ListRetained();
  ASSERT_THAT(listed, IsOk());
  ASSERT_EQ(listed->sets_size(), 1);
  EXPECT_TRUE(listed->sets(0).asleep()) << "a failed wake leaves the set asleep";
  // One stays: the wake must find room elsewhere if its range is still taken.
  for (size_t i = 1; i < held.size(); ++i) held[i].Release();
  ASSERT_THAT(session->device().SynchronizeStream(session->default_stream()), IsOk());
  absl::StatusOr<v1::RetainedSet> woken;
  for (const absl::Time deadline = absl::Now() + kTimeout; absl::Now() < deadline;) {
    woken = session->Wake(Key(0));
    if (woken.ok()) break;
    absl::SleepFor(absl::Milliseconds(5));  // the releases are still draining
  }
  ASSERT_THAT(woken, IsOk());
  auto again = session->Fetch(Key(0));
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->data() == place, woken->moved() == 0);
  ExpectTensorsMatch(*session, *again);
}

TEST_F(ApiRetainedTest, AnIdleSetIsReleasedOnceItsTimeToLivePasses) {
  std::unique_ptr<Session> session = Open();
  auto retained = session->Retain(Key(0), absl::Milliseconds(300));
  ASSERT_THAT(retained, IsOk());
  EXPECT_EQ(retained->ttl_ms(), 300u);
  {
    auto lease = session->Fetch(Key(0));
    ASSERT_THAT(lease, IsOk());
    // Held longer than the time to live: a set in use is never idle.
    absl::SleepFor(absl::Seconds(2));
    auto listed = session->ListRetained();
    ASSERT_THAT(listed, IsOk());
    ASSERT_EQ(listed->sets_size(), 1);
    EXPECT_EQ(listed->sets(0).idle_ms(), 0u);
  }
  const absl::Time deadline = absl::Now() + kTimeout;
  while (Stats().retained_sets() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  const v1::Stats stats = Stats();
  EXPECT_EQ(stats.retained_sets(), 0u);
  EXPECT_EQ(stats.retained_sets_expired(), 1u);
  EXPECT_EQ(stats.retained_bytes(), 0u);
}

TEST_F(ApiRetainedTest, ReadersNeverSeeWrongBytesWhileTheSetSleepsAndWakes) {
  std::unique_ptr<Session> session = Open();
  ASSERT_THAT(session->Retain(Key(0)), IsOk());
  std::atomic<bool> stop{false};
  std::atomic<int> reads{0};
  std::thread reader([&] {
    std::unique_ptr<Session> own = Open();
    while (!stop.load()) {
      for (int block : {0, 5}) {
        auto lease = own->Fetch(Key(block));
        if (!lease.ok()) {
          // Only room can be short (a wake holds two objects' worth while the pool is shared).
          EXPECT_THAT(lease, StatusIs(absl::StatusCode::kResourceExhausted));
          continue;
        }
        ExpectTensorsMatch(*own, *lease);
        lease->Release();
        reads.fetch_add(1);
      }
    }
  });
  int slept = 0;
  int woken = 0;
  const absl::Time end = absl::Now() + absl::Seconds(3);
  while (absl::Now() < end) {
    absl::StatusOr<v1::RetainedSet> sleep = session->Sleep(Key(0));
    if (sleep.ok()) {
      ++slept;
    } else {
      EXPECT_THAT(sleep, StatusIs(absl::StatusCode::kFailedPrecondition)) << "leased, or asleep";
    }
    absl::StatusOr<v1::RetainedSet> wake = session->Wake(Key(0));
    if (wake.ok()) {
      ++woken;
    } else {
      EXPECT_THAT(wake, StatusIs(absl::StatusCode::kResourceExhausted));
    }
  }
  stop = true;
  reader.join();
  EXPECT_GT(reads.load(), 0);
  EXPECT_GT(slept, 0) << "the reader never let go";
  EXPECT_GT(woken, 0);
}

TEST_F(ApiRetainedTest, RetainedSetsComeBackAfterADaemonRestart) {
  {
    std::unique_ptr<Session> session = Open();
    ASSERT_THAT(session->Retain(Key(0)), IsOk());
    ASSERT_THAT(session->Retain(Key(1), absl::Hours(1)), IsOk());
    ASSERT_THAT(session->Sleep(Key(1)), IsOk());
  }
  ASSERT_NO_FATAL_FAILURE(RestartDaemon());
  std::unique_ptr<Session> session = Open();
  auto listed = session->ListRetained();
  ASSERT_THAT(listed, IsOk());
  ASSERT_EQ(listed->sets_size(), 2);
  EXPECT_EQ(listed->sets(0).target(), Key(0));
  EXPECT_FALSE(listed->sets(0).asleep());
  EXPECT_EQ(listed->sets(1).target(), Key(1));
  EXPECT_TRUE(listed->sets(1).asleep());
  EXPECT_EQ(listed->sets(1).ttl_ms(), 3600u * 1000);
  // Retaining it again answers once it is back on the GPU.
  ASSERT_THAT(session->Retain(Key(0)), IsOk());
  EXPECT_TRUE(OnGpu(Key(0)));
  EXPECT_FALSE(OnGpu(Key(1)));
  const uint64_t misses = Stats().gpu().misses();
  auto lease = session->Fetch(Key(0));
  ASSERT_THAT(lease, IsOk());
  ExpectTensorsMatch(*session, *lease);
  EXPECT_EQ(Stats().gpu().misses(), misses);
  ASSERT_THAT(session->Wake(Key(1)), IsOk());
  EXPECT_TRUE(OnGpu(Key(1)));
}

TEST_F(ApiRetainedTest, ASetThatLostAnObjectInARestartIsNotRetainedAgainPartly) {
  {
    std::unique_ptr<Session> session = Open();
    StoreRequest durable;
    durable.durable = true;
    ASSERT_THAT(StoreBytes(*session, "proc/kept", testing::PatternBytes(64 << 10, 1), durable),
                IsOk());
    ASSERT_THAT(StoreBytes(*session, "proc/lost", testing::PatternBytes(64 << 10, 2)), IsOk());
    ASSERT_THAT(StoreBytes(*session, "whole/kept", testing::PatternBytes(64 << 10, 3), durable),
                IsOk());
    auto retained = session->Retain("proc/");
    ASSERT_THAT(retained, IsOk());
    EXPECT_EQ(retained->objects(), 2u);
    ASSERT_THAT(session->Retain("whole/"), IsOk());
  }
  ASSERT_NO_FATAL_FAILURE(RestartDaemon());
  std::unique_ptr<Session> session = Open();
  auto listed = session->ListRetained();
  ASSERT_THAT(listed, IsOk());
  ASSERT_EQ(listed->sets_size(), 1) << "proc/ came back with one of its two objects: not at all";
  EXPECT_EQ(listed->sets(0).target(), "whole/");
}

TEST_F(ApiRetainedTest, ASetWhoseModelIsDroppedIsLetGo) {
  std::unique_ptr<Session> session = Open();
  ASSERT_THAT(session->Retain(Key(0)), IsOk());
  ASSERT_THAT(client_->DropModel("m"), IsOk());
  // It would pin bytes nobody can fetch any more: gone within the sweep's second. The set leaves
  // the list just before its pins are let go (outside the sets' lock), so wait for both.
  const absl::Time deadline = absl::Now() + kTimeout;
  v1::Stats stats = Stats();
  while ((stats.retained_sets() > 0 || stats.pins() > 0) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    stats = Stats();
  }
  EXPECT_EQ(stats.retained_sets(), 0u);
  EXPECT_EQ(stats.retained_bytes(), 0u);
  EXPECT_EQ(stats.pins(), 0u);
  EXPECT_EQ(stats.retained_sets_expired(), 0u) << "let go for a change, not a time to live";
}

TEST_F(ApiRetainedTest, AHostileOrDamagedRecordOfSetsIsReadSafely) {
  // A target twice (awake, then asleep: the first counts, or the budget and the pins would be
  // counted for a set the record then calls asleep), malformed lines, a time to live over a year,
  // a count of objects that does not match, and an unknown model.
  const std::string record = absl::StrCat(
      "tierd retained sets v1\n", "0\t0\t1\t", Key(0), "\n", "0\t1\t1\t", Key(0), "\n",
      "garbage\n", "-5\t0\t1\t", Key(1), "\n", "0\t2\t1\t", Key(1), "\n",
      "99999999999999\t0\t1\t", Key(1), "\n", "0\t0\t3\t", Key(2), "\n",
      "0\t0\t8\tno-such-model\n", "0\t1\t1\t", Key(3), "\n");
  const std::string record_path = absl::StrCat(dir_.path(), "/state/retained-default.sets");
  ASSERT_NO_FATAL_FAILURE(
      RestartDaemon([&] { ASSERT_THAT(testing::WriteFile(record_path, record), IsOk()); }));
  std::unique_ptr<Session> session = Open();
  ASSERT_THAT(session->Retain(Key(0)), IsOk());  // answers once it is back
  auto listed = session->ListRetained();
  ASSERT_THAT(listed, IsOk());
  ASSERT_EQ(listed->sets_size(), 2);
  EXPECT_EQ(listed->sets(0).target(), Key(0));
  EXPECT_FALSE(listed->sets(0).asleep());
  EXPECT_EQ(listed->sets(1).target(), Key(3));
  EXPECT_TRUE(listed->sets(1).asleep());
  EXPECT_EQ(listed->bytes(), 2 * kRows * kCols * 4) << "one set awake, counted once";
  // Released, it holds nothing: no pin and no budget left behind.
  ASSERT_THAT(session->Unretain(Key(0)), IsOk());
  EXPECT_EQ(Stats().retained_bytes(), 0u);
  EXPECT_EQ(Stats().pins(), 0u);
  ASSERT_THAT(session->Retain(Key(4)), IsOk());
  ASSERT_THAT(session->Retain(Key(5)), IsOk());
}

TEST_F(ApiRetainedTest, TierctlRetainsListsSleepsWakesAndReleases) {
  auto retained = Tierctl({"retain", Key(0), "--ttl=2h"});
  ASSERT_EQ(retained.exit_code, 0) << retained.output;
  EXPECT_THAT(retained.output, HasSubstr("on gpu"));
  auto listed = Tierctl({"retained"});
  ASSERT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_THAT(listed.output, HasSubstr(Key(0)));
  EXPECT_THAT(listed.output, HasSubstr("2h"));
  EXPECT_THAT(listed.output, HasSubstr("1 set(s); 512 KiB on the GPU of a 1 MiB budget"));
  auto slept = Tierctl({"--json", "sleep", Key(0)});
  ASSERT_EQ(slept.exit_code, 0) << slept.output;
  EXPECT_EQ(nlohmann::json::parse(slept.output)["asleep"], true);
  EXPECT_EQ(Tierctl({"wake", Key(0)}).exit_code, 0);
  EXPECT_EQ(Tierctl({"unretain", Key(0)}).exit_code, 0);
  auto with_stderr = [&](const std::vector<std::string>& args) {
    auto run = testing::RunTierctl(socket_path(), args, kTimeout, /*with_stderr=*/true);
    EXPECT_THAT(run, IsOk());
    return run.ok() ? *run : testing::RunResult{};
  };
  auto gone = with_stderr({"unretain", Key(0)});
  EXPECT_EQ(gone.exit_code, 1);
  EXPECT_THAT(gone.output, HasSubstr("NOT_FOUND"));
  auto misplaced = with_stderr({"sleep", Key(0), "--ttl=1h"});
  EXPECT_EQ(misplaced.exit_code, 2);
  EXPECT_THAT(misplaced.output, HasSubstr("does not take --ttl"));
  auto bad_ttl = with_stderr({"retain", Key(0), "--ttl=soon"});
  EXPECT_EQ(bad_ttl.exit_code, 2);
  EXPECT_THAT(bad_ttl.output, HasSubstr("--ttl=soon"));
}

}  // namespace
}  // namespace api_test
}  // namespace tierd
