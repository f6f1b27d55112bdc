// A soak: many sessions doing random operations against one tierd process for a bounded time
// (TIERD_SOAK_SECONDS, default 20). Sessions fetch and release model blocks, store, fetch and
// delete objects of their own (some durable, some spillable), prefetch, pin and unpin, evict, and
// end — some cleanly, some while still holding leases. Every byte fetched is checked; the only
// errors allowed are the ones the load provokes by design (RESOURCE_EXHAUSTED when the pool or the
// host cache is full, FAILED_PRECONDITION for evicting what is in use). At the end the daemon must
// hold nothing for anyone, and its memory must not have grown after the warm-up.
//
// The figures (operations by kind, errors by code, memory) are recorded as test properties, which
// tests/reliability-report.sh reads from gtest's JSON output.
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/tierd_client.h"
#include "common/sanitizers.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_test_support.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOk;
using ::tierd::testing::IsOkAndHolds;
using ::tierd::testing::ResidentKiB;
using ::tierd::testing::SiblingBinary;
using ::tierd::testing::Subprocess;
using ::tierd::testing::TempDir;

constexpr absl::Duration kTimeout = absl::Seconds(30);
constexpr int kBlocks = 8;
constexpr int kWorkers = 8;
#if TIERD_UNDER_ASAN
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif

absl::Duration SoakLength() {
  int seconds = 20;
  if (const char* value = std::getenv("TIERD_SOAK_SECONDS"); value != nullptr) {
    if (!absl::SimpleAtoi(value, &seconds) || seconds <= 0) seconds = 20;
  }
  return absl::Seconds(seconds);
}

// What the workers did, in total.
class Tally {
 public:
  void Operation(const std::string& kind) {
    absl::MutexLock lock(&mu_);
    ++operations_[kind];
  }
  // Records a failure of `kind`; false when it is not one the load may provoke.
  bool Error(const std::string& kind, const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    ++errors_[absl::StatusCodeToString(status.code())];
    const bool expected =
        status.code() == absl::StatusCode::kResourceExhausted ||
        (kind == "evict" && status.code() == absl::StatusCode::kFailedPrecondition);
    if (!expected) unexpected_.push_back(absl::StrCat(kind, ": ", status.ToString()));
    return expected;
  }
  void WrongBytes(const std::string& what) {
    absl::MutexLock lock(&mu_);
    unexpected_.push_back(absl::StrCat("wrong bytes: ", what));
  }
  std::map<std::string, int64_t> operations() const {
    absl::MutexLock lock(&mu_);
    return operations_;
  }
  std::map<std::string, int64_t> errors() const {
    absl::MutexLock lock(&mu_);
    return errors_;
  }
  std::vector<std::string> unexpected() const {
    absl::MutexLock lock(&mu_);
    return unexpected_;
  }

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, int64_t> operations_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> errors_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> unexpected_ ABSL_GUARDED_BY(mu_);
};

class SoakTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string model = absl::StrCat(dir_.path(), "/model");
    ASSERT_EQ(::mkdir(model.c_str(), 0755), 0);
    std::vector<testing::TensorSpec> tensors;
    for (int block = 0; block < kBlocks; ++block) {
      tensors.push_back(testing::RandomTensor(absl::StrCat("blocks.", block, ".w"), "F32",
                                              {128, static_cast<uint64_t>(256 + 64 * block)},
                                              50 + block));
      expected_.push_back(tensors.back().data);
    }
    ASSERT_THAT(testing::WriteSafetensors(absl::StrCat(model, "/model.safetensors"), tensors),
                IsOk());
    socket_path_ = absl::StrCat(dir_.path(), "/gpu0.sock");
    // Budgets small enough that the load fills them: evictions, spills, refusals.
    auto daemon = testing::StartServingDaemon(
        {SiblingBinary("tierd"), "--device=host", absl::StrCat("--socket=", socket_path_),
         absl::StrCat("--state-dir=", dir_.path(), "/state"), "--host-cache-bytes=24MiB",
         "--gpu-pool-bytes=4MiB", "--gpu-slab-bytes=2MiB", "--session-max-leases=6"},
        socket_path_, kTimeout);
    ASSERT_THAT(daemon, IsOk());
    daemon_ = *std::move(daemon);
    auto client = Connect(/*grpc_only=*/false);
    ASSERT_THAT(client, IsOk());
    client_ = *std::move(client);
    ASSERT_THAT(client_->RegisterModel("m", model, v1::GROUPING_BLOCK), IsOk());
  }

  void TearDown() override {
    client_.reset();
    if (daemon_ != nullptr) {
      daemon_->Signal(SIGTERM);
      EXPECT_THAT(daemon_->Wait(kTimeout), IsOkAndHolds(0));
    }
  }

  absl::StatusOr<std::unique_ptr<Client>> Connect(bool grpc_only) const {
    ClientOptions options;
    options.socket_path = socket_path_;
    if (grpc_only) options.session_socket_path = "";
    return Client::Connect(options);
  }

  // One worker: sessions one after another, each doing a random run of operations.
  void Work(int worker, absl::Time until) {
    std::mt19937_64 random(1000 + worker);
    auto client = Connect(/*grpc_only=*/worker % 2 == 1);
    if (!client.ok()) return (void)tally_.Error("connect", client.status());
    int version = 0;
    while (absl::Now() < until) {
      auto session = (*client)->OpenSession();
      tally_.Operation("open");
      if (!session.ok()) {
        tally_.Error("open", session.status());
        continue;
      }
      std::vector<Lease> held;
      const int steps = 5 + static_cast<int>(random() % 40);
      for (int step = 0; step < steps && absl::Now() < until; ++step) {
        RandomStep(worker, random, **session, held, version);
      }
      // Half the sessions end with leases still held: the daemon releases them.
      if (random() % 2 == 0) {
        for (Lease& lease : held) lease.Release();
        tally_.Operation("release");
      } else {
        tally_.Operation("end holding");
      }
      held.clear();
      session->reset();
    }
  }

  void RandomStep(int worker, std::mt19937_64& random, Session& session, std::vector<Lease>& held,
                  int& version) {
    const std::string stored_key = absl::StrCat("w", worker, "/obj", random() % 4);
    switch (random() % 9) {
      case 0:
      case 1:
      case 2: {  // fetch a block, check it, keep it for a while
        const int block = static_cast<int>(random() % kBlocks);
        tally_.Operation("fetch");
        auto lease = session.Fetch(absl::StrCat("m/blocks.", block));
        if (!lease.ok()) return (void)tally_.Error("fetch", lease.status());
        if (!session.device().SynchronizeStream(session.default_stream()).ok() ||
            lease->size() != expected_[block].size() ||
            std::memcmp(lease->data(), expected_[block].data(), lease->size()) != 0) {
          tally_.WrongBytes(absl::StrCat("m/blocks.", block));
        }
        held.push_back(*std::move(lease));
        if (held.size() > 3 || random() % 2 == 0) {
          held.front().Release();
          held.erase(held.begin());
          tally_.Operation("release");
        }
        return;
      }
      case 3: {  // store a version of one of this worker's objects
        const int seed = worker * 1000000 + ++version;
        std::string bytes(64 * 1024 * (1 + random() % 8), '\0');
        testing::FillPattern(bytes.data() + 8, bytes.size() - 8, seed);
        std::memcpy(bytes.data(), &seed, sizeof(seed));
        StoreRequest store;
        store.durable = random() % 4 == 0;
        store.spillable = !store.durable;
        tally_.Operation(store.durable ? "store durable" : "store");
        absl::Status status = testing::StoreBytes(session, stored_key, bytes, store);
        if (!status.ok()) tally_.Error("store", status);
        return;
      }
      case 4: {  // fetch one of this worker's objects: its bytes must match its own seed
        tally_.Operation("fetch stored");
        auto lease = session.Fetch(stored_key);
        if (!lease.ok()) {
          if (lease.status().code() == absl::StatusCode::kNotFound) return;  // never stored
          return (void)tally_.Error("fetch stored", lease.status());
        }
        (void)session.device().SynchronizeStream(session.default_stream());
        int seed = 0;
        std::memcpy(&seed, lease->data(), sizeof(seed));
        if (seed / 1000000 != worker ||
            testing::FirstPatternMismatch(static_cast<const uint8_t*>(lease->data()) + 8,
                                          lease->size() - 8, seed) != -1) {
          tally_.WrongBytes(stored_key);
        }
        lease->Release();
        return;
      }
      case 5: {  // evict from a tier, or delete
        const v1::Tier tiers[] = {v1::TIER_GPU, v1::TIER_HOST, v1::TIER_ALL};
        const v1::Tier tier = tiers[random() % 3];
        const std::string key =
            random() % 2 == 0 ? stored_key : absl::StrCat("m/blocks.", random() % kBlocks);
        if (tier == v1::TIER_ALL && key[0] == 'm') return;
        tally_.Operation("evict");
        auto evicted = client_->Evict(key, tier);
        if (!evicted.ok() && evicted.status().code() != absl::StatusCode::kNotFound) {
          tally_.Error("evict", evicted.status());
        }
        return;
      }
      case 6: {  // prefetch
        tally_.Operation("prefetch");
        absl::Status status = session.Prefetch({absl::StrCat("m/blocks.", random() % kBlocks)});
        if (!status.ok()) tally_.Error("prefetch", status);
        return;
      }
      case 7: {  // pin, then unpin
        const std::string key = absl::StrCat("m/blocks.", random() % kBlocks);
        tally_.Operation("pin");
        absl::Status status = session.Pin(key);
        if (!status.ok()) return (void)tally_.Error("pin", status);
        status = session.Unpin(key);
        if (!status.ok()) tally_.Error("unpin", status);
        return;
      }
      default:  // release everything held
        for (Lease& lease : held) lease.Release();
        held.clear();
        tally_.Operation("release");
        return;
    }
  }

  TempDir dir_;
  std::string socket_path_;
  std::vector<std::string> expected_;
  std::unique_ptr<Subprocess> daemon_;
  std::unique_ptr<Client> client_;
  Tally tally_;
};

TEST_F(SoakTest, ManySessionsOfRandomOperationsLoseNothingAndLeaveNothing) {
  const absl::Duration length = SoakLength();
  const absl::Time start = absl::Now();
  const absl::Time until = start + length;
  std::vector<std::thread> workers;
  for (int worker = 0; worker < kWorkers; ++worker) {
    workers.emplace_back([this, worker, until] { Work(worker, until); });
  }
  // Memory after the warm-up (the arena is pinned at start; caches and pools fill early) against
  // memory at the end.
  absl::SleepFor(length / 4);
  const int64_t warm_kib = ResidentKiB(daemon_->pid());
  for (std::thread& worker : workers) worker.join();
  const int64_t end_kib = ResidentKiB(daemon_->pid());

  for (const std::string& problem : tally_.unexpected()) ADD_FAILURE() << problem;
  // Nothing held for anyone once every session has ended.
  absl::StatusOr<v1::Stats> stats;
  const absl::Time deadline = absl::Now() + kTimeout;
  do {
    stats = client_->GetStats();
  } while (!(stats.ok() && stats->sessions() == 0 && stats->leases() == 0 &&
             stats->reservations() == 0 && stats->pins() == 0 && stats->copies_in_flight() == 0) &&
           absl::Now() < deadline);
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->sessions(), 0u);
  EXPECT_EQ(stats->leases(), 0u);
  EXPECT_EQ(stats->reservations(), 0u);
  EXPECT_EQ(stats->pins(), 0u);
  EXPECT_EQ(stats->copies_in_flight(), 0u);
  EXPECT_EQ(stats->checksum_failures(), 0u);
  EXPECT_LE(stats->gpu().used_bytes(), stats->gpu().budget_bytes());
  // Allocator noise is a few MiB; a leak per operation would be far more over this many. Under
  // AddressSanitizer freed memory waits in its quarantine (256 MiB), so RSS says nothing there;
  // LeakSanitizer checks the daemon's exit instead (TearDown expects status 0).
  if (!kAddressSanitizer) {
    EXPECT_LT(end_kib - warm_kib, 16 * 1024)
        << "RSS " << warm_kib << " KiB -> " << end_kib << " KiB";
  }

  int64_t operations = 0;
  std::string summary;
  for (const auto& [kind, count] : tally_.operations()) {
    operations += count;
    absl::StrAppend(&summary, " ", kind, "=", count);
    RecordProperty(absl::StrCat("op ", kind), std::to_string(count));
  }
  std::string errors;
  for (const auto& [code, count] : tally_.errors()) {
    absl::StrAppend(&errors, " ", code, "=", count);
    RecordProperty(absl::StrCat("error ", code), std::to_string(count));
  }
  RecordProperty("seconds", std::to_string(absl::ToInt64Seconds(length)));
  RecordProperty("sessions", std::to_string(kWorkers));
  RecordProperty("operations", std::to_string(operations));
  RecordProperty("unexpected", std::to_string(tally_.unexpected().size()));
  RecordProperty("rss_warm_kib", std::to_string(warm_kib));
  RecordProperty("rss_end_kib", std::to_string(end_kib));
  std::printf(
      "soak: %s, %d workers, %lld operations:%s; expected errors:%s; RSS %lld -> %lld KiB\n",
      absl::FormatDuration(length).c_str(), kWorkers, static_cast<long long>(operations),
      summary.c_str(), errors.empty() ? " none" : errors.c_str(), static_cast<long long>(warm_kib),
      static_cast<long long>(end_kib));
}

}  // namespace
}  // namespace tierd
