// Cross-GPU handoff (tierd --peers) between two tierd processes on the device under test: an object
// stored through one daemon is fetched through the other, which copies it from the first's staging
// into its own. On the CUDA build both daemons share GPU 0, which runs the same protocol (IPC
// handles, interprocess events) as two GPUs do; the two-GPU run is bench/pipeline_bench.py's.
// Both ways of copying run: GPU to GPU (direct) and through the lender's pinned host buffer, and
// the automatic fallback from one to the other when the lender's memory cannot be opened.
#include <grp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "client/tierd_client.h"
#include "common/status_macros.h"
#include "device/device_factory.h"
#include "device/device_wrapper.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/daemon.h"
#include "server/node/peer_daemons.h"
#include "tests/daemon_test_support.h"
#include "tests/test_support.h"
#include "wire/session_socket.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::tierd::testing::FetchBytes;
using ::tierd::testing::IsOk;
using ::tierd::testing::IsOkAndHolds;
using ::tierd::testing::PatternBytes;
using ::tierd::testing::SiblingBinary;
using ::tierd::testing::StatusIs;
using ::tierd::testing::StoreBytes;
using ::tierd::testing::Subprocess;
using ::tierd::testing::TempDir;

constexpr absl::Duration kTimeout = absl::Seconds(30);

// Parameter: the daemons' --peer-copy, "direct" or "host".
class PeerHandoffTest : public ::testing::TestWithParam<const char*> {
 protected:
  static constexpr int kDaemons = 2;

  void SetUp() override {
    for (int i = 0; i < kDaemons; ++i) {
      StartDaemon(i);
      ASSERT_NE(daemons_[i], nullptr);
    }
  }

  void TearDown() override {
    for (int i = 0; i < kDaemons; ++i) {
      sessions_[i].reset();
      clients_[i].reset();
    }
    // The borrower first: a daemon's shutdown grace waits for the sessions open to it, among
    // them its peers'.
    for (int i = kDaemons - 1; i >= 0; --i) StopDaemon(i);
  }

  bool through_host() const { return std::string(GetParam()) == "host"; }
  std::string socket_path(int i) const { return absl::StrCat(dir_.path(), "/gpu", i, ".sock"); }

  // Daemon i names every daemon as its peer (its own socket is skipped), as a node's shared
  // configuration would.
  void StartDaemon(int i) {
    std::vector<std::string> argv = {
        SiblingBinary("tierd"),
        absl::StrCat("--device=", testing::DeviceUnderTest().ToString()),
        absl::StrCat("--socket=", socket_path(i)),
        absl::StrCat("--state-dir=", dir_.path(), "/state", i),
        "--host-cache-bytes=64MiB",
        "--gpu-pool-bytes=16MiB",
        "--gpu-slab-bytes=8MiB",
        "--shutdown-grace-ms=500",
        absl::StrCat("--peers=", socket_path(0), ",", socket_path(1)),
        absl::StrCat("--peer-copy=", GetParam())};
    argv.insert(argv.end(), extra_flags_.begin(), extra_flags_.end());
    auto daemon = testing::StartServingDaemon(argv, socket_path(i), kTimeout);
    ASSERT_THAT(daemon, IsOk());
    daemons_[i] = *std::move(daemon);
  }

  void StopDaemon(int i) {
    if (daemons_[i] == nullptr) return;
    daemons_[i]->Signal(SIGTERM);
    EXPECT_THAT(daemons_[i]->Wait(kTimeout), IsOkAndHolds(0));
    daemons_[i].reset();
  }

  Client& client(int i) {
    if (clients_[i] == nullptr) {
      ClientOptions options;
      options.socket_path = socket_path(i);
      options.client_name = absl::StrCat("peer_handoff_test to ", i);
      auto client = Client::Connect(options);
      EXPECT_THAT(client, IsOk());
      clients_[i] = *std::move(client);
    }
    return *clients_[i];
  }

  Session& session(int i) {
    if (sessions_[i] == nullptr) {
      auto session = client(i).OpenSession();
      EXPECT_THAT(session, IsOk());
      sessions_[i] = *std::move(session);
    }
    return *sessions_[i];
  }

  v1::Stats Stats(int i) {
    auto stats = client(i).GetStats();
    EXPECT_THAT(stats, IsOk());
    return stats.ok() ? *stats : v1::Stats();
  }

  // Waits until daemon i holds no lease: a peer's lease is given back once the copy that reads it
  // has completed, shortly after the fetch is answered.
  void ExpectLeasesDrain(int i) {
    const absl::Time deadline = absl::Now() + kTimeout;
    uint64_t leases = 0;
    while (absl::Now() < deadline) {
      leases = Stats(i).leases();
      if (leases == 0) return;
      absl::SleepFor(absl::Milliseconds(10));
    }
    ADD_FAILURE() << "daemon " << i << " still holds " << leases << " lease(s)";
  }

  TempDir dir_;
  std::vector<std::string> extra_flags_;  // for every daemon StartDaemon starts
  std::unique_ptr<Subprocess> daemons_[kDaemons];
  std::unique_ptr<Client> clients_[kDaemons];
  std::unique_ptr<Session> sessions_[kDaemons];
};

TEST_P(PeerHandoffTest, StoredThroughOneDaemonIsFetchedThroughTheOther) {
  const std::string bytes = PatternBytes(3 << 20, 1);
  StoreRequest request;
  v1::TensorInfo tensor;
  tensor.set_name("hidden");
  tensor.set_dtype("F32");
  tensor.add_shape(768);
  tensor.add_shape(1024);
  tensor.set_offset(0);
  tensor.set_size(bytes.size());
  request.tensors.push_back(tensor);
  ASSERT_THAT(StoreBytes(session(0), "act/window-0", bytes, request), IsOk());

  auto lease = session(1).Fetch("act/window-0");
  ASSERT_THAT(lease, IsOk());
  ASSERT_EQ(lease->size(), bytes.size());
  ASSERT_EQ(lease->tensors().size(), 1u);
  EXPECT_EQ(lease->tensors()[0].name(), "hidden");
  EXPECT_THAT(lease->tensors()[0].shape(), ::testing::ElementsAre(768, 1024));
  EXPECT_EQ(testing::LeaseBytes(session(1), *lease), bytes);
  lease->Release();

  // The bytes are counted when the copy's completion callback runs, which may be just after the
  // reader saw the copy's ready event.
  v1::Stats receiver = Stats(1);
  for (const absl::Time deadline = absl::Now() + absl::Seconds(5);
       receiver.bytes_peer_to_gpu() < bytes.size() && absl::Now() < deadline; receiver = Stats(1)) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(receiver.peer_fetches(), 1u);
  EXPECT_EQ(receiver.bytes_peer_to_gpu(), bytes.size());
  EXPECT_EQ(receiver.peer_fetches_through_host(), through_host() ? 1u : 0u);
  ExpectLeasesDrain(0);
  ExpectLeasesDrain(1);
}

TEST_P(PeerHandoffTest, EveryFetchCopiesThePeersCurrentVersion) {
  ASSERT_THAT(StoreBytes(session(0), "act/x", PatternBytes(1 << 20, 1)), IsOk());
  EXPECT_THAT(FetchBytes(session(1), "act/x"), IsOkAndHolds(PatternBytes(1 << 20, 1)));
  // A new version under the same key, smaller: no stale copy is served.
  ASSERT_THAT(StoreBytes(session(0), "act/x", PatternBytes(1000, 2)), IsOk());
  EXPECT_THAT(FetchBytes(session(1), "act/x"), IsOkAndHolds(PatternBytes(1000, 2)));
  EXPECT_EQ(Stats(1).peer_fetches(), 2u);
  // Only fetches ask peers.
  EXPECT_THAT(session(1).Prefetch({"act/x"}), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(session(1).Pin("act/x"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_P(PeerHandoffTest, ACopyOutlivesThePeersEvictionAndNewVersions) {
  const std::string bytes = PatternBytes(2 << 20, 3);
  ASSERT_THAT(StoreBytes(session(0), "act/y", bytes), IsOk());
  auto lease = session(1).Fetch("act/y");
  ASSERT_THAT(lease, IsOk());
  ExpectLeasesDrain(0);
  ASSERT_THAT(session(0).Evict("act/y", v1::TIER_ALL), IsOk());
  EXPECT_THAT(FetchBytes(session(0), "act/y"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(testing::LeaseBytes(session(1), *lease), bytes);
  // A new version stored at the lender leaves the borrower's lease as it was.
  ASSERT_THAT(StoreBytes(session(0), "act/y", PatternBytes(2 << 20, 4)), IsOk());
  EXPECT_EQ(testing::LeaseBytes(session(1), *lease), bytes);
  lease->Release();
}

TEST_P(PeerHandoffTest, AKeyNoDaemonHasIsNotFoundWithoutLooping) {
  // Each daemon names the other: a fetch of an unknown key asks the other once, not forever.
  for (int i = 0; i < kDaemons; ++i) {
    auto lease = session(i).Fetch("act/nobody-has-this");
    EXPECT_THAT(lease, StatusIs(absl::StatusCode::kNotFound));
    EXPECT_THAT(lease.status().message(), HasSubstr(socket_path(1 - i)));
  }
  EXPECT_EQ(Stats(0).peer_fetches(), 0u);
  EXPECT_EQ(Stats(1).peer_fetches(), 0u);
}

// A daemon's peers go with its GPU tiers, as soon as the last search has been answered. The answer
// may come before the thread that asked has set its timeout, and its handler may hold the session
// a moment longer: the teardown must wait for that thread before the timer goes (it did not: a
// race TSan saw in a daemon's shutdown), and end the sessions on its own thread, not on a session's
// reader, which cannot join itself (std::terminate). Several threads at once make the asking
// thread lose its CPU at such a moment more often.
TEST_P(PeerHandoffTest, PeersMayGoTheMomentTheirLastSearchIsAnswered) {
  auto device = CreateDevice(testing::DeviceUnderTest());
  ASSERT_THAT(device, IsOk());
  auto path = ParsePeerCopyPath(GetParam());
  ASSERT_THAT(path, IsOk());
  constexpr int kThreads = 4;
  constexpr int kRounds = 25;
  std::atomic<int> answered_not_found{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        PeerDaemonsOptions options;
        options.sockets = {socket_path(0)};
        options.own_socket = absl::StrCat(dir_.path(), "/this-process-", t, ".sock");
        options.path = *path;
        auto peers = PeerDaemons::Create(**device, std::move(options));
        ASSERT_THAT(peers, IsOk());
        absl::Notification answered;
        absl::Status status;
        (*peers)->Fetch("act/nobody-has-this", [&](absl::StatusOr<PeerCopy> copy) {
          status = copy.status();
          answered.Notify();
        });
        ASSERT_TRUE(answered.WaitForNotificationWithTimeout(kTimeout));
        if (absl::IsNotFound(status)) ++answered_not_found;
        peers->reset();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(answered_not_found.load(), kThreads * kRounds);
}

TEST_P(PeerHandoffTest, APeerThatRestartsIsReconnected) {
  ASSERT_THAT(StoreBytes(session(0), "act/z", PatternBytes(4096, 4)), IsOk());
  EXPECT_THAT(FetchBytes(session(1), "act/z"), IsOkAndHolds(PatternBytes(4096, 4)));

  sessions_[0].reset();
  clients_[0].reset();
  StopDaemon(0);
  auto gone = session(1).Fetch("act/z");
  EXPECT_THAT(gone, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(gone.status().message(), HasSubstr(socket_path(0)));

  StartDaemon(0);
  ASSERT_NE(daemons_[0], nullptr);
  ASSERT_THAT(StoreBytes(session(0), "act/z", PatternBytes(4096, 5)), IsOk());
  EXPECT_THAT(FetchBytes(session(1), "act/z"), IsOkAndHolds(PatternBytes(4096, 5)));
}

// The node's other daemon hangs: it takes connections and answers nothing. A fetch of a key this
// daemon lacks asks it on a thread of its own, within bounds; meanwhile every other session of
// this daemon — all served by one session thread here — is answered at once; and the next fetch
// that would ask the hung peer does not wait for it again. (The peer was once asked on the
// session thread, which it then held for the greeting's timeout, and for ever when it answered
// the greeting and then nothing.)
TEST_P(PeerHandoffTest, AHungPeerHoldsUpNoOtherSession) {
  if (through_host()) GTEST_SKIP() << "the copy path plays no part here";
  sessions_[1].reset();
  clients_[1].reset();
  StopDaemon(1);
  const int hung = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(hung, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string hung_path = SessionSocketPathFor(socket_path(1));
  std::snprintf(address.sun_path, sizeof(address.sun_path), "%s", hung_path.c_str());
  ASSERT_EQ(::bind(hung, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(hung, 64), 0);  // connections wait in the backlog, never accepted
  sessions_[0].reset();
  clients_[0].reset();
  StopDaemon(0);
  extra_flags_ = {"--session-threads=1", "--node-home-timeout-ms=2000"};
  StartDaemon(0);
  ASSERT_NE(daemons_[0], nullptr);
  const std::string here = PatternBytes(4096, 6);
  ASSERT_THAT(StoreBytes(session(0), "act/here", here), IsOk());
  auto other = client(0).OpenSession();
  ASSERT_THAT(other, IsOk());

  absl::Status missing;
  absl::Duration asked_for;
  std::thread asker([&] {
    const absl::Time start = absl::Now();
    missing = (*other)->Fetch("act/elsewhere").status();
    asked_for = absl::Now() - start;
  });
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time start = absl::Now();
  for (int i = 0; i < 20; ++i) {
    EXPECT_THAT(FetchBytes(session(0), "act/here"), IsOkAndHolds(here));
  }
  const absl::Duration served_in = absl::Now() - start;
  asker.join();
  EXPECT_LT(served_in, absl::Seconds(2)) << "the other session waited for the hung peer";
  EXPECT_THAT(missing, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(std::string(missing.message()), HasSubstr(socket_path(1)));
  EXPECT_LT(asked_for, absl::Seconds(15));
  // Passed over now, for a while: the next such fetch does not wait for it.
  const absl::Time again = absl::Now();
  EXPECT_THAT((*other)->Fetch("act/elsewhere-too").status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_LT(absl::Now() - again, absl::Seconds(1));
  other->reset();
  ::close(hung);
  ::unlink(hung_path.c_str());
}

// A peer that stops answering once its session is open (SIGSTOP): a fetch that asks it is given
// up on after --node-home-timeout-ms, instead of waiting for ever; once the peer answers again,
// after its back-off, it lends as before.
TEST_P(PeerHandoffTest, APeerThatStopsAnsweringIsGivenUpOnWithinTheTimeout) {
  if (through_host()) GTEST_SKIP() << "the copy path plays no part here";
  sessions_[0].reset();
  clients_[0].reset();
  StopDaemon(0);
  extra_flags_ = {"--node-home-timeout-ms=1500"};
  StartDaemon(0);
  ASSERT_NE(daemons_[0], nullptr);
  const std::string bytes = PatternBytes(4096, 8);
  ASSERT_THAT(StoreBytes(session(1), "act/there", bytes), IsOk());
  EXPECT_THAT(FetchBytes(session(0), "act/there"), IsOkAndHolds(bytes));  // the session is open
  ExpectLeasesDrain(1);
  ASSERT_THAT(daemons_[1]->Stop(kTimeout), IsOk());
  const absl::Time start = absl::Now();
  absl::Status missing = session(0).Fetch("act/there-too").status();
  const absl::Duration took = absl::Now() - start;
  EXPECT_THAT(missing, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(std::string(missing.message()), HasSubstr("answered nothing within"));
  EXPECT_GE(took, absl::Seconds(1));
  EXPECT_LT(took, absl::Seconds(10));
  daemons_[1]->Signal(SIGCONT);
  absl::StatusOr<std::string> back;
  for (const absl::Time deadline = absl::Now() + kTimeout; absl::Now() < deadline;) {
    back = FetchBytes(session(0), "act/there");
    if (back.ok()) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_THAT(back, IsOkAndHolds(bytes));
}

TEST_P(PeerHandoffTest, ConcurrentFetchesThroughThePeerAllGetTheirBytes) {
  constexpr int kObjects = 16;
  for (int k = 0; k < kObjects; ++k) {
    ASSERT_THAT(StoreBytes(session(0), absl::StrCat("act/", k), PatternBytes((64 << 10) + k, k)),
                IsOk());
  }
  constexpr int kThreads = 4;
  constexpr int kRounds = 8;
  std::atomic<int> good{0};
  std::vector<std::thread> threads;
  Client& receiver = client(1);  // made here: client() is not thread-safe
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto own = receiver.OpenSession();
      ASSERT_THAT(own, IsOk());
      for (int round = 0; round < kRounds; ++round) {
        const int k = (t * kRounds + round) % kObjects;
        absl::StatusOr<std::string> bytes = FetchBytes(**own, absl::StrCat("act/", k));
        EXPECT_THAT(bytes, IsOkAndHolds(PatternBytes((64 << 10) + k, k)));
        if (bytes.ok() && *bytes == PatternBytes((64 << 10) + k, k)) ++good;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(good.load(), kThreads * kRounds);
  EXPECT_EQ(Stats(1).peer_fetches(), static_cast<uint64_t>(kThreads * kRounds));
  ExpectLeasesDrain(0);
  ExpectLeasesDrain(1);
}

INSTANTIATE_TEST_SUITE_P(CopyPaths, PeerHandoffTest, ::testing::Values("direct", "host"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param) == "host" ? "ThroughHost" : "Direct";
                         });

// A device that cannot open another process's staging slabs, as a GPU without peer access to
// the GPU they live on.
class NoPeerAccessDevice : public DeviceWrapper {
 public:
  explicit NoPeerAccessDevice(std::unique_ptr<Device> target)
      : DeviceWrapper(*target), target_(std::move(target)) {}
  absl::StatusOr<std::unique_ptr<Slab>> OpenSlab(absl::string_view) override {
    ++refused;
    return absl::FailedPreconditionError("peer access is not supported (injected)");
  }
  std::atomic<int> refused{0};

 private:
  std::unique_ptr<Device> target_;
};

TEST(PeerCopyFallbackTest, AutoCopiesThroughTheHostWhenThePeersMemoryCannotBeOpened) {
  if (testing::DeviceUnderTest().ToString() != "host") {
    // The borrower runs in this process, and so must this test's client of it: CUDA does not let
    // a process open the IPC handles it exported. The CUDA copy through the host is covered by
    // PeerHandoffTest's ThroughHost cases.
    GTEST_SKIP() << "host backend only";
  }
  TempDir dir;
  const std::string lender_socket = absl::StrCat(dir.path(), "/gpu0.sock");
  auto lender = testing::StartServingDaemon(
      {SiblingBinary("tierd"), absl::StrCat("--device=", testing::DeviceUnderTest().ToString()),
       absl::StrCat("--socket=", lender_socket), absl::StrCat("--state-dir=", dir.path(), "/s0"),
       "--host-cache-bytes=32MiB", "--gpu-pool-bytes=8MiB", "--gpu-slab-bytes=8MiB"},
      lender_socket, kTimeout);
  ASSERT_THAT(lender, IsOk());

  // The borrower runs in this process, on a device that cannot open the lender's slabs.
  NoPeerAccessDevice* device = nullptr;
  DaemonOptions options;
  options.socket_path = absl::StrCat(dir.path(), "/gpu1.sock");
  options.session_socket_path = SessionSocketPathFor(options.socket_path);
  options.state_dir = absl::StrCat(dir.path(), "/s1");
  options.host_cache_bytes = 32 << 20;
  options.gpu_pool_bytes = 8 << 20;
  options.gpu_slab_bytes = 8 << 20;
  options.peer_sockets = {lender_socket};
  options.create_device = [&device]() -> absl::StatusOr<std::unique_ptr<Device>> {
    ASSIGN_OR_RETURN(std::unique_ptr<Device> real, CreateDevice(testing::DeviceUnderTest()));
    auto wrapped = std::make_unique<NoPeerAccessDevice>(std::move(real));
    device = wrapped.get();
    return wrapped;
  };
  auto borrower = Daemon::Create(options);
  ASSERT_THAT(borrower, IsOk());

  ClientOptions to_lender;
  to_lender.socket_path = lender_socket;
  auto lender_client = Client::Connect(to_lender);
  ASSERT_THAT(lender_client, IsOk());
  auto lender_session = (*lender_client)->OpenSession();
  ASSERT_THAT(lender_session, IsOk());
  ClientOptions to_borrower;
  to_borrower.socket_path = options.socket_path;
  auto borrower_client = Client::Connect(to_borrower);
  ASSERT_THAT(borrower_client, IsOk());
  auto borrower_session = (*borrower_client)->OpenSession();
  ASSERT_THAT(borrower_session, IsOk());

  for (int round = 0; round < 3; ++round) {
    const std::string bytes = PatternBytes((1 << 20) + round, 10 + round);
    ASSERT_THAT(StoreBytes(**lender_session, "act/h", bytes), IsOk());
    EXPECT_THAT(FetchBytes(**borrower_session, "act/h"), IsOkAndHolds(bytes));
  }
  auto stats = (*borrower_client)->GetStats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->peer_fetches(), 3u);
  EXPECT_EQ(stats->peer_fetches_through_host(), 3u);
  // Only the first lease was tried direct; the lender was asked through the host from then on.
  EXPECT_EQ(device->refused.load(), 1);

  borrower_session->reset();
  borrower_client->reset();
  borrower->reset();
  lender_session->reset();
  lender_client->reset();
  (*lender)->Signal(SIGTERM);
  EXPECT_THAT((*lender)->Wait(kTimeout), IsOkAndHolds(0));
}

// Only the default group lends and borrows: a client group's stored objects are not handed to a
// peer, and a group's sessions do not ask peers.
TEST(PeerClientGroupsTest, ClientGroupsNeitherLendNorBorrow) {
  const struct group* unix_group = ::getgrgid(::getgid());
  ASSERT_NE(unix_group, nullptr);
  TempDir dir;
  std::string sockets[2];
  std::unique_ptr<Subprocess> daemons[2];
  for (int i = 0; i < 2; ++i) sockets[i] = absl::StrCat(dir.path(), "/gpu", i, ".sock");
  for (int i = 0; i < 2; ++i) {
    auto daemon = testing::StartServingDaemon(
        {SiblingBinary("tierd"), absl::StrCat("--device=", testing::DeviceUnderTest().ToString()),
         absl::StrCat("--socket=", sockets[i]), absl::StrCat("--state-dir=", dir.path(), "/s", i),
         "--host-cache-bytes=32MiB", "--gpu-pool-bytes=8MiB", "--gpu-slab-bytes=4MiB",
         "--shutdown-grace-ms=500", absl::StrCat("--peers=", sockets[0], ",", sockets[1]),
         absl::StrCat("--client-groups=tenant:", unix_group->gr_name, ":4MiB")},
        sockets[i], kTimeout);
    ASSERT_THAT(daemon, IsOk());
    daemons[i] = *std::move(daemon);
  }
  std::unique_ptr<Client> clients[2][2];  // [daemon][0: default group, 1: tenant]
  std::unique_ptr<Session> sessions[2][2];
  for (int i = 0; i < 2; ++i) {
    for (int group = 0; group < 2; ++group) {
      ClientOptions options;
      options.socket_path = sockets[i];
      options.client_group = group == 0 ? "" : "tenant";
      auto client = Client::Connect(options);
      ASSERT_THAT(client, IsOk());
      clients[i][group] = *std::move(client);
      auto session = clients[i][group]->OpenSession();
      ASSERT_THAT(session, IsOk());
      sessions[i][group] = *std::move(session);
    }
  }
  const std::string bytes = PatternBytes(4096, 7);
  ASSERT_THAT(StoreBytes(*sessions[0][1], "act/tenants", bytes), IsOk());
  ASSERT_THAT(StoreBytes(*sessions[0][0], "act/everyones", bytes), IsOk());
  // GPU 1's default group borrows the default group's object, not the tenant's.
  EXPECT_THAT(FetchBytes(*sessions[1][0], "act/everyones"), IsOkAndHolds(bytes));
  EXPECT_THAT(FetchBytes(*sessions[1][0], "act/tenants"), StatusIs(absl::StatusCode::kNotFound));
  // GPU 1's tenant asks nobody: neither object is there for it.
  EXPECT_THAT(FetchBytes(*sessions[1][1], "act/tenants"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(FetchBytes(*sessions[1][1], "act/everyones"), StatusIs(absl::StatusCode::kNotFound));
  auto stats = clients[1][0]->GetStats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->peer_fetches(), 1u);

  for (int i = 1; i >= 0; --i) {
    sessions[i][0].reset();
    sessions[i][1].reset();
    clients[i][0].reset();
    clients[i][1].reset();
    daemons[i]->Signal(SIGTERM);
    EXPECT_THAT(daemons[i]->Wait(kTimeout), IsOkAndHolds(0));
  }
}

TEST(PeerFlagsTest, ARelativePeerSocketIsRefused) {
  TempDir dir;
  auto daemon = Subprocess::Start(
      {SiblingBinary("tierd"), "--device=host", absl::StrCat("--socket=", dir.path(), "/gpu0.sock"),
       absl::StrCat("--state-dir=", dir.path(), "/state"), "--peers=gpu1.sock"});
  ASSERT_THAT(daemon, IsOk());
  EXPECT_THAT((*daemon)->Wait(kTimeout), IsOkAndHolds(2));
}

}  // namespace
}  // namespace tierd
