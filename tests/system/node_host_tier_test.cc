// The node's host tier (tierd --peers, docs/NODE.md) across real daemon processes on the device
// under test: each model object is read from disk and kept in host memory by its home daemon
// only, and the others copy it to their GPU from the home's host arena. On the CUDA build the
// daemons share GPU 0, which runs the same protocol (a peer's arena mapped and registered with
// each daemon's own CUDA context) as several GPUs do.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/tierd_client.h"
#include "common/status_macros.h"
#include "device/shared_memory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_test_support.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"
#include "wire/session_socket.h"
#include "wire/wire_format.h"

namespace tierd {
namespace {

using ::tierd::testing::FetchBytes;
using ::tierd::testing::IsOk;
using ::tierd::testing::IsOkAndHolds;
using ::tierd::testing::RandomTensor;
using ::tierd::testing::SiblingBinary;
using ::tierd::testing::StatusIs;
using ::tierd::testing::StoreBytes;
using ::tierd::testing::Subprocess;
using ::tierd::testing::TempDir;
using ::tierd::testing::TensorSpec;

constexpr absl::Duration kTimeout = absl::Seconds(30);
constexpr int kDaemons = 3;

class NodeHostTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_dir_ = absl::StrCat(dir_.path(), "/model");
    ASSERT_EQ(::mkdir(model_dir_.c_str(), 0755), 0);
    // 16 objects of 256 KiB to 1 MiB, one per tensor: 10 MiB.
    WriteModel(16, 64);
  }

  // Writes model "m" (before the daemons start): `objects` tensors of 1 to 4 times `rows` rows of
  // 4 KiB, one object each.
  void WriteModel(int objects, uint64_t rows) {
    tensors_.clear();
    model_bytes_ = 0;
    for (int i = 0; i < objects; ++i) {
      tensors_.push_back(
          RandomTensor(absl::StrCat("w", i), "F32", {rows * (1 + i % 4), 1024}, 100 + i));
      model_bytes_ += tensors_.back().data.size();
    }
    ASSERT_THAT(testing::WriteSafetensors(absl::StrCat(model_dir_, "/model.safetensors"), tensors_),
                IsOk());
  }

  void TearDown() override {
    sessions_.clear();
    clients_.clear();
    for (int i = kDaemons - 1; i >= 0; --i) StopDaemon(i);
  }

  std::string socket_path(int i) const { return absl::StrCat(dir_.path(), "/gpu", i, ".sock"); }

  // Every daemon names the whole node, itself included, as a shared configuration would.
  void StartDaemons(const std::string& host_cache_bytes = "16MiB",
                    const std::vector<std::string>& extra = {}) {
    extra_flags_ = extra;
    host_cache_bytes_ = host_cache_bytes;
    for (int i = 0; i < kDaemons; ++i) {
      StartDaemon(i);
      if (HasFatalFailure()) return;
    }
    for (int i = 0; i < kDaemons; ++i) {
      const auto other = other_model_dir_.find(i);
      ASSERT_THAT(
          client(i).RegisterModel("m", other == other_model_dir_.end() ? model_dir_ : other->second,
                                  v1::GROUPING_TENSOR),
          IsOk());
    }
  }

  // Daemon i, with the flags StartDaemons was given.
  void StartDaemon(int i) {
    std::vector<std::string> argv = {
        SiblingBinary("tierd"),
        absl::StrCat("--device=", testing::DeviceUnderTest().ToString()),
        absl::StrCat("--socket=", socket_path(i)),
        absl::StrCat("--state-dir=", dir_.path(), "/state", i),
        absl::StrCat("--host-cache-bytes=", host_cache_bytes_),
        "--gpu-pool-bytes=16MiB",
        "--gpu-slab-bytes=8MiB",
        "--reader-threads=2",
        "--shutdown-grace-ms=500",
        "--node-home-timeout-ms=2000",
        absl::StrCat("--peers=", socket_path(0), ",", socket_path(1), ",", socket_path(2))};
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
    std::unique_ptr<Client>& client = clients_[i];
    if (client == nullptr) {
      ClientOptions options;
      options.socket_path = socket_path(i);
      options.client_name = absl::StrCat("node_host_tier_test to ", i);
      auto connected = Client::Connect(options);
      EXPECT_THAT(connected, IsOk());
      if (connected.ok()) client = *std::move(connected);
    }
    return *client;
  }

  Session& session(int i) {
    std::unique_ptr<Session>& session = sessions_[i];
    if (session == nullptr) {
      auto opened = client(i).OpenSession();
      EXPECT_THAT(opened, IsOk());
      if (opened.ok()) session = *std::move(opened);
    }
    return *session;
  }

  v1::Stats Stats(int i) {
    auto stats = client(i).GetStats();
    EXPECT_THAT(stats, IsOk());
    return stats.ok() ? *stats : v1::Stats();
  }

  // Waits until no peer holds a host lease on daemon i: they are given back once the copies that
  // read them have completed, shortly after the fetches are answered.
  void ExpectHostLeasesDrain(int i) {
    uint64_t held = 0;
    for (const absl::Time deadline = absl::Now() + kTimeout; absl::Now() < deadline;) {
      held = Stats(i).node_host_leases();
      if (held == 0) return;
      absl::SleepFor(absl::Milliseconds(10));
    }
    ADD_FAILURE() << "peers still hold " << held << " host lease(s) on daemon " << i;
  }

  // Fetches every object through daemon i and checks its bytes.
  void FetchAllAndCheck(int i) {
    for (const TensorSpec& tensor : tensors_) {
      EXPECT_THAT(FetchBytes(session(i), "m/" + tensor.name), IsOkAndHolds(tensor.data))
          << "daemon " << i << ", " << tensor.name;
    }
  }

  // Fetches every object through daemon i's session `own` once, starting at object `first`, and
  // evicts them from its GPU; returns how many answers were wrong or failed (each a test failure
  // too).
  int LoadRound(int i, Session& own, size_t first) {
    int wrong = 0;
    for (size_t t = 0; t < tensors_.size(); ++t) {
      const TensorSpec& tensor = tensors_[(first + t) % tensors_.size()];
      absl::StatusOr<std::string> bytes = FetchBytes(own, "m/" + tensor.name);
      if (!bytes.ok() || *bytes != tensor.data) {
        ++wrong;
        ADD_FAILURE() << "daemon " << i << ", " << tensor.name << ": "
                      << (bytes.ok() ? "wrong bytes" : bytes.status().ToString());
      }
    }
    (void)own.Evict("m/", v1::TIER_GPU);
    return wrong;
  }

  // The objects homed on daemon i, by their index in tensors_.
  std::vector<size_t> HomedOn(int i) {
    std::vector<size_t> homed;
    auto listed = client(0).ListObjects("m");
    EXPECT_THAT(listed, IsOk());
    if (!listed.ok()) return homed;
    for (const v1::ObjectInfo& object : *listed) {
      if (object.home() == socket_path(i)) homed.push_back(std::stoul(object.key().substr(3)));
    }
    std::sort(homed.begin(), homed.end());
    return homed;
  }

  // A session on daemon i's session socket that opens as a node's daemon does; `fd` its socket.
  struct RawSession {
    int fd = -1;
    uint64_t next_id = 2;
    std::string arena;  // the name of the home's host arena, sent with the open answer
  };
  RawSession OpenAsNodeDaemon(int i) {
    RawSession raw;
    raw.fd = testing::ConnectUnix(SessionSocketPathFor(socket_path(i)));
    v1::SessionRequest open = testing::OpenRequest(1, "node_host_tier_test as a daemon");
    open.mutable_open()->set_node_daemon(true);
    EXPECT_THAT(SendAll(raw.fd, absl::StrCat(SessionSocketHello(), EncodeFrame(open))), IsOk());
    std::string greeting(SessionSocketHello().size(), '\0');
    EXPECT_THAT(ReadExactly(raw.fd, greeting.data(), greeting.size()), IsOk());
    absl::StatusOr<v1::SessionResponse> opened = Answer(raw);
    EXPECT_THAT(opened, IsOk());
    if (opened.ok()) {
      for (const v1::Handle& handle : opened->new_handles()) {
        if (handle.kind() == v1::Handle::HOST_ARENA) raw.arena = handle.handle();
      }
    }
    return raw;
  }
  absl::StatusOr<v1::SessionResponse> Answer(RawSession& raw) {
    std::string payload;
    RETURN_IF_ERROR(ReadFrame(raw.fd, payload));
    v1::SessionResponse response;
    if (!response.ParseFromString(payload))
      return absl::InternalError("an answer that does not parse");
    if (response.code() != 0) {
      return absl::Status(static_cast<absl::StatusCode>(response.code()), response.message());
    }
    return response;
  }
  // A host lease on `key`, as a node's daemon asks for one.
  absl::StatusOr<v1::SessionResponse> LeaseHost(RawSession& raw, const std::string& key) {
    v1::SessionRequest request = testing::FetchRequestFor(raw.next_id++, key);
    request.mutable_fetch()->set_local_only(true);
    request.mutable_fetch()->set_host_lease(true);
    RETURN_IF_ERROR(SendAll(raw.fd, EncodeFrame(request)));
    return Answer(raw);
  }
  absl::Status ReleaseHost(RawSession& raw, uint64_t lease_id) {
    v1::SessionRequest request;
    request.set_request_id(raw.next_id++);
    request.mutable_release()->set_lease_id(lease_id);
    RETURN_IF_ERROR(SendAll(raw.fd, EncodeFrame(request)));
    return Answer(raw).status();
  }

  TempDir dir_;
  std::string host_cache_bytes_;
  std::vector<std::string> extra_flags_;
  std::string model_dir_;
  std::vector<TensorSpec> tensors_;
  uint64_t model_bytes_ = 0;
  // Daemons that register "m" from another directory than model_dir_.
  std::map<int, std::string> other_model_dir_;
  std::unique_ptr<Subprocess> daemons_[kDaemons];
  std::map<int, std::unique_ptr<Client>> clients_;
  std::map<int, std::unique_ptr<Session>> sessions_;
};

TEST_F(NodeHostTierTest, EachObjectIsReadAndPinnedOnceForTheNode) {
  StartDaemons();
  for (int i = 0; i < kDaemons; ++i) FetchAllAndCheck(i);
  for (int i = 0; i < kDaemons; ++i) ExpectHostLeasesDrain(i);

  // Where each object lives on the node, as every daemon lists it.
  auto listed = client(0).ListObjects("m");
  ASSERT_THAT(listed, IsOk());
  ASSERT_EQ(listed->size(), tensors_.size());
  std::map<std::string, int> homed;
  std::map<std::string, uint64_t> homed_bytes;
  for (const v1::ObjectInfo& object : *listed) {
    ++homed[object.home()];
    homed_bytes[object.home()] += object.size();
  }
  uint64_t disk = 0, objects_held = 0, homes_total = 0, borrowed = 0, borrowed_bytes = 0;
  for (int i = 0; i < kDaemons; ++i) {
    const v1::Stats stats = Stats(i);
    SCOPED_TRACE(absl::StrCat("daemon ", i));
    EXPECT_EQ(stats.node_daemons(), static_cast<uint64_t>(kDaemons));
    EXPECT_EQ(stats.node_fallbacks(), 0u);
    // Exactly the objects homed here were read here, and only they are held here.
    EXPECT_EQ(stats.bytes_disk_to_host(), homed_bytes[socket_path(i)]);
    EXPECT_EQ(stats.node_objects_homed(), static_cast<uint64_t>(homed[socket_path(i)]));
    EXPECT_EQ(stats.host().objects(), static_cast<uint64_t>(homed[socket_path(i)]));
    // The others were borrowed from their homes, once each.
    EXPECT_EQ(stats.node_host_fetches(), tensors_.size() - homed[socket_path(i)]);
    EXPECT_EQ(stats.bytes_node_host_to_gpu(), model_bytes_ - homed_bytes[socket_path(i)]);
    EXPECT_EQ(stats.node_host_leases_served(),
              static_cast<uint64_t>(homed[socket_path(i)]) * (kDaemons - 1));
    disk += stats.bytes_disk_to_host();
    objects_held += stats.host().objects();
    homes_total += stats.node_objects_homed();
    borrowed += stats.node_host_fetches();
    borrowed_bytes += stats.bytes_node_host_to_gpu();
  }
  EXPECT_EQ(disk, model_bytes_);
  EXPECT_EQ(objects_held, tensors_.size());
  EXPECT_EQ(homes_total, tensors_.size());
  EXPECT_EQ(borrowed, tensors_.size() * (kDaemons - 1));
  EXPECT_EQ(borrowed_bytes, model_bytes_ * (kDaemons - 1));

  // Fetched again, from the GPUs or the homes: nothing more is read.
  for (int i = 0; i < kDaemons; ++i) {
    ASSERT_THAT(session(i).Evict("m/", v1::TIER_GPU), IsOk());
    FetchAllAndCheck(i);
  }
  uint64_t disk_again = 0;
  for (int i = 0; i < kDaemons; ++i) disk_again += Stats(i).bytes_disk_to_host();
  EXPECT_EQ(disk_again, model_bytes_);
}

// Tensor-parallel ranks, one per daemon, each fetching its shard of every tensor: each shard is
// read from disk once for the node, by its home, whichever rank asks first; their shards add up to
// the model. Every daemon then fetching every rank's shards reads nothing more.
TEST_F(NodeHostTierTest, EachShardIsReadOnceForTheNode) {
  StartDaemons();
  auto shard_key = [](const TensorSpec& tensor, int rank, size_t t) {
    return ShardKey("m/" + tensor.name, static_cast<uint32_t>(t % 2), rank, kDaemons);
  };
  auto check = [&](int daemon, int rank) {
    for (size_t t = 0; t < tensors_.size(); ++t) {
      EXPECT_THAT(FetchBytes(session(daemon), shard_key(tensors_[t], rank, t)),
                  IsOkAndHolds(testing::TensorSplit(tensors_[t], t % 2, rank, kDaemons)))
          << "daemon " << daemon << ", rank " << rank << ", " << tensors_[t].name;
    }
  };
  for (int rank = 0; rank < kDaemons; ++rank) check(rank, rank);
  uint64_t disk = 0;
  for (int i = 0; i < kDaemons; ++i) disk += Stats(i).bytes_disk_to_host();
  EXPECT_EQ(disk, model_bytes_);

  for (int i = 0; i < kDaemons; ++i) {
    ASSERT_THAT(session(i).Evict("m/", v1::TIER_GPU), IsOk());
    for (int rank = 0; rank < kDaemons; ++rank) check(i, rank);
  }
  uint64_t disk_again = 0, fallbacks = 0;
  for (int i = 0; i < kDaemons; ++i) {
    const v1::Stats stats = Stats(i);
    disk_again += stats.bytes_disk_to_host();
    fallbacks += stats.node_fallbacks();
  }
  EXPECT_EQ(disk_again, model_bytes_);
  EXPECT_EQ(fallbacks, 0u);
}

TEST_F(NodeHostTierTest, EachDaemonRegistersItsPeersArenasBeforeAnyLoad) {
  StartDaemons();
  // Nothing fetched: each daemon connected to the others as it started and registered their
  // arenas (16 MiB each) in the background.
  for (int i = 0; i < kDaemons; ++i) {
    uint64_t registered = 0;
    for (const absl::Time deadline = absl::Now() + kTimeout;
         registered < 2 * (16u << 20) && absl::Now() < deadline;
         registered = Stats(i).node_peer_arena_bytes()) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_EQ(registered, 2 * (16u << 20)) << "daemon " << i;
    EXPECT_EQ(Stats(i).node_host_fetches(), 0u);
  }
}

TEST_F(NodeHostTierTest, PrefetchesGoToTheHome) {
  StartDaemons();
  std::vector<std::string> keys;
  for (const TensorSpec& tensor : tensors_) keys.push_back("m/" + tensor.name);
  ASSERT_THAT(client(0).Prefetch(keys, /*host_only=*/true), IsOk());
  // Each object lands in its home's host cache, nowhere else.
  uint64_t held = 0;
  for (const absl::Time deadline = absl::Now() + kTimeout;
       held < tensors_.size() && absl::Now() < deadline;) {
    held = 0;
    for (int i = 0; i < kDaemons; ++i) held += Stats(i).host().objects();
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(held, tensors_.size());
  auto listed = client(1).ListObjects("m");
  ASSERT_THAT(listed, IsOk());
  for (int i = 0; i < kDaemons; ++i) {
    auto own = client(i).ListObjects("m");
    ASSERT_THAT(own, IsOk());
    for (const v1::ObjectInfo& object : *own) {
      EXPECT_EQ(object.in_host_cache(), object.home() == socket_path(i)) << object.key();
    }
  }
  EXPECT_EQ(Stats(0).node_fallbacks(), 0u);
}

TEST_F(NodeHostTierTest, AHomeKilledMidLoadLeavesTheOthersCorrect) {
  StartDaemons();
  // Two daemons load the model over and over while the third is killed: every fetch answers with
  // the right bytes, from the home while it lives and from the disk afterwards.
  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0};
  std::vector<std::thread> loaders;
  for (int i = 0; i < 2; ++i) {
    loaders.emplace_back([&, i, &own = session(i)] {
      while (!stop.load()) wrong += LoadRound(i, own, 0);
    });
  }
  absl::SleepFor(absl::Milliseconds(300));
  daemons_[2]->Signal(SIGKILL);
  EXPECT_THAT(daemons_[2]->Wait(kTimeout), IsOkAndHolds(128 + SIGKILL));
  daemons_[2].reset();
  clients_.erase(2);
  absl::SleepFor(absl::Milliseconds(500));
  stop = true;
  for (std::thread& loader : loaders) loader.join();
  EXPECT_EQ(wrong.load(), 0);

  // The objects homed on the dead daemon are read where they are wanted now, once each.
  FetchAllAndCheck(0);
  FetchAllAndCheck(1);
  auto listed = client(0).ListObjects("m");
  ASSERT_THAT(listed, IsOk());
  int homed_on_dead = 0;
  for (const v1::ObjectInfo& object : *listed) homed_on_dead += object.home() == socket_path(2);
  if (homed_on_dead > 0) {
    EXPECT_GT(Stats(0).node_fallbacks() + Stats(1).node_fallbacks(), 0u);
  }
  // Nothing is held for the dead daemon, nor by it.
  for (int i = 0; i < 2; ++i) {
    ExpectHostLeasesDrain(i);
    EXPECT_EQ(Stats(i).leases(), 0u);
  }
}

// A home killed with SIGKILL leaves its arena in /dev/shm, mapped by its peers, whose space comes
// back only once nobody maps it. The peers let go of it once their sessions to it have ended and
// no copy reads it (they once kept it mapped for ever, even after the home was back); the home
// comes back, and lends again.
TEST_F(NodeHostTierTest, AKilledHomesArenaIsUnmappedByItsPeersAndTheHomeComesBack) {
  StartDaemons();
  for (int i = 0; i < 2; ++i) FetchAllAndCheck(i);
  const pid_t killed = daemons_[2]->pid();
  const std::string arena = absl::StrCat("/tierd.", killed, ".arena");
  auto maps_arena = [&](int i) {
    std::ifstream maps(absl::StrCat("/proc/", daemons_[i]->pid(), "/maps"));
    std::string line;
    while (std::getline(maps, line)) {
      if (line.find(arena) != std::string::npos) return true;
    }
    return false;
  };
  ASSERT_TRUE(maps_arena(0) && maps_arena(1)) << "the peers never mapped " << arena;
  daemons_[2]->Signal(SIGKILL);
  EXPECT_THAT(daemons_[2]->Wait(kTimeout), IsOkAndHolds(128 + SIGKILL));
  daemons_[2].reset();
  clients_.erase(2);
  for (int i = 0; i < 2; ++i) {
    bool mapped = true;
    for (const absl::Time deadline = absl::Now() + kTimeout; mapped && absl::Now() < deadline;) {
      Stats(i);  // the stats let go of ended sessions, as the health monitor's sampling does
      mapped = maps_arena(i);
      if (mapped) absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_FALSE(mapped) << "daemon " << i << " still maps the dead home's arena " << arena;
  }
  // Back with the same flags (and its catalog): it removes what it left in /dev/shm and serves the
  // node again.
  StartDaemon(2);
  for (int i = 0; i < kDaemons; ++i) {
    sessions_.erase(i);
    FetchAllAndCheck(i);
  }
  EXPECT_EQ(Stats(0).node_fallbacks() + Stats(1).node_fallbacks(), 0u)
      << "the restarted home did not lend";
}

// A daemon that cannot map its home's arena (here it is out of sight when the daemon connects)
// reads the home's objects itself meanwhile, and asks for the arena again later: once it can be
// mapped the objects are borrowed again. (One failure once stopped borrowing from that home for
// the process's life.)
TEST_F(NodeHostTierTest, AHomesArenaThatCouldNotBeMappedIsTriedAgainLater) {
  host_cache_bytes_ = "16MiB";
  StartDaemon(0);
  ASSERT_FALSE(HasFatalFailure());
  const std::string arena = absl::StrCat("/dev/shm/tierd.", daemons_[0]->pid(), ".arena");
  const std::string hidden = arena + ".hidden";
  ASSERT_EQ(std::rename(arena.c_str(), hidden.c_str()), 0) << arena;
  StartDaemon(1);
  ASSERT_FALSE(HasFatalFailure());
  for (int i = 0; i < 2; ++i) {
    ASSERT_THAT(client(i).RegisterModel("m", model_dir_, v1::GROUPING_TENSOR), IsOk());
  }
  const std::vector<size_t> homed = HomedOn(0);
  ASSERT_FALSE(homed.empty());
  const TensorSpec& object = tensors_[homed[0]];
  EXPECT_THAT(FetchBytes(session(1), "m/" + object.name), IsOkAndHolds(object.data));
  EXPECT_EQ(Stats(1).node_host_fetches(), 0u);
  EXPECT_GE(Stats(1).node_fallbacks(), 1u);

  ASSERT_EQ(std::rename(hidden.c_str(), arena.c_str()), 0);
  bool borrowed = false;
  for (const absl::Time deadline = absl::Now() + kTimeout; !borrowed && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(500));
    (void)session(1).Evict("m/" + object.name, v1::TIER_ALL);  // read here: it must go first
    EXPECT_THAT(FetchBytes(session(1), "m/" + object.name), IsOkAndHolds(object.data));
    borrowed = Stats(1).node_host_fetches() > 0;
  }
  EXPECT_TRUE(borrowed) << "the home's arena was never asked for again";
}

TEST_F(NodeHostTierTest, EvictionAtTheHomeNeverMovesBytesUnderACopy) {
  // Host caches of 3 MiB against a model of 10 MiB: the homes together cannot hold it (9 MiB), so
  // some home evicts and reads again while its peers copy out of it. Each daemon fetches one
  // object of at most 512 KiB at a time, and a peer's lease may outlive its answer briefly: a
  // home holds at most five objects at once (its own and two from each peer), 2.5 MiB.
  WriteModel(32, 32);
  StartDaemons("3MiB");
  std::atomic<int> wrong{0};
  std::vector<std::thread> loaders;
  for (int i = 0; i < kDaemons; ++i) {
    loaders.emplace_back([&, i, &own = session(i)] {
      for (int round = 0; round < 4; ++round) wrong += LoadRound(i, own, i * 5);
    });
  }
  for (std::thread& loader : loaders) loader.join();
  EXPECT_EQ(wrong.load(), 0);
  uint64_t evictions = 0;
  for (int i = 0; i < kDaemons; ++i) {
    ExpectHostLeasesDrain(i);
    evictions += Stats(i).host().evictions();
  }
  EXPECT_GT(evictions, 0u);
}

TEST_F(NodeHostTierTest, AHomeThatHangsIsWaitedForBoundedly) {
  StartDaemons();
  auto listed = client(0).ListObjects("m");
  ASSERT_THAT(listed, IsOk());
  std::string key;
  for (const v1::ObjectInfo& object : *listed) {
    if (object.home() == socket_path(2)) key = object.key();
  }
  if (key.empty()) GTEST_SKIP() << "no object is homed on daemon 2 with these socket paths";
  // Open daemon 0's session to daemon 2 first, so that the hang is in the lease, not the connect.
  ASSERT_THAT(FetchBytes(session(0), key), IsOk());
  // Off the GPU once its lease has drained, so the next fetch asks the home again.
  absl::Status evicted;
  for (const absl::Time deadline = absl::Now() + kTimeout; absl::Now() < deadline;) {
    evicted = session(0).Evict(key, v1::TIER_GPU).status();
    if (evicted.ok()) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_THAT(evicted, IsOk());
  ASSERT_THAT(daemons_[2]->Stop(kTimeout), IsOk());
  const absl::Time start = absl::Now();
  const std::string expected = tensors_[std::stoi(key.substr(3))].data;
  EXPECT_THAT(FetchBytes(session(0), key), IsOkAndHolds(expected));
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Seconds(1.5));  // --node-home-timeout-ms=2000
  EXPECT_LT(took, absl::Seconds(15));
  EXPECT_EQ(Stats(0).node_fallbacks(), 1u);
  // Daemon 0 stops while the lease it asked for is still unanswered: the answer (the session
  // ending) comes after its node tier has gone, and finds it gone (under ASan, a use of freed
  // memory otherwise).
  sessions_.erase(0);
  clients_.erase(0);
  StopDaemon(0);
  daemons_[2]->Signal(SIGCONT);
}

TEST_F(NodeHostTierTest, ADaemonWithTheModelFromOtherFilesIsNeitherLentNorBorrowedFrom) {
  // Daemon 2's "m" has the same tensors, shapes and sizes, and other bytes.
  std::vector<TensorSpec> other;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorSpec& tensor = tensors_[i];
    other.push_back(RandomTensor(tensor.name, tensor.dtype, tensor.shape, 900 + i));
  }
  const std::string other_dir = absl::StrCat(dir_.path(), "/other-model");
  ASSERT_EQ(::mkdir(other_dir.c_str(), 0755), 0);
  ASSERT_THAT(testing::WriteSafetensors(absl::StrCat(other_dir, "/model.safetensors"), other),
              IsOk());
  other_model_dir_[2] = other_dir;
  StartDaemons();
  auto listed = client(0).ListObjects("m");
  ASSERT_THAT(listed, IsOk());
  uint64_t homed_on_2 = 0;
  for (const v1::ObjectInfo& object : *listed) homed_on_2 += object.home() == socket_path(2);

  // Every daemon serves its own registration's bytes: the homes refuse a lease whose files differ.
  FetchAllAndCheck(0);
  for (const TensorSpec& tensor : other) {
    EXPECT_THAT(FetchBytes(session(2), "m/" + tensor.name), IsOkAndHolds(tensor.data))
        << tensor.name;
  }
  EXPECT_EQ(Stats(0).node_fallbacks(), homed_on_2);
  EXPECT_EQ(Stats(2).node_fallbacks(), tensors_.size() - homed_on_2);
}

// A home lends an object to a daemon whose session then breaks (the daemon lives on, and may still
// be about to copy). The object stays put however long that takes and whatever the home reads
// meanwhile — no timer lets it go — until that daemon's process gives the lease back on a later
// session, or exits. (A 5 s timer let the range be read into again under a slow borrower.)
TEST_F(NodeHostTierTest, ALeaseWhoseSessionEndedIsHeldUntilItsProcessReleasesItOrExits) {
  WriteModel(32, 32);  // 128 to 512 KiB objects, 10 MiB: more than a 3 MiB host cache holds
  StartDaemons("3MiB");
  const std::vector<size_t> homed = HomedOn(0);
  ASSERT_GE(homed.size(), 4u);
  const TensorSpec& lent = tensors_[homed[0]];
  RawSession borrower = OpenAsNodeDaemon(0);
  auto lease = LeaseHost(borrower, "m/" + lent.name);
  ASSERT_THAT(lease, IsOk());
  auto arena = SharedMemory::OpenReadOnly(borrower.arena);
  ASSERT_THAT(arena, IsOk());
  auto lent_bytes = [&] {
    return std::string(static_cast<const char*>((*arena)->data()) + lease->lease().host_offset(),
                       lease->lease().length());
  };
  ASSERT_EQ(lent_bytes(), lent.data);
  ::close(borrower.fd);  // the session breaks; this process goes on

  // The home reads and evicts its other objects, round after round, for longer than 5 s.
  const absl::Time until = absl::Now() + absl::Seconds(6);
  while (absl::Now() < until) {
    for (size_t t : homed) {
      if (t == homed[0]) continue;
      EXPECT_THAT(FetchBytes(session(0), "m/" + tensors_[t].name), IsOkAndHolds(tensors_[t].data));
    }
    (void)session(0).Evict("m/", v1::TIER_ALL);
  }
  EXPECT_GT(Stats(0).host().evictions(), 0u);
  EXPECT_EQ(lent_bytes(), lent.data) << "the lent range was read into while it was lent";
  EXPECT_EQ(Stats(0).node_host_leases(), 1u);
  EXPECT_EQ(Stats(0).node_host_leases_kept(), 1u);
  EXPECT_EQ(Stats(0).node_host_lent_bytes(), lent.data.size());

  // Another process cannot give it back; this one can, on a later session.
  RawSession later = OpenAsNodeDaemon(0);
  EXPECT_THAT(ReleaseHost(later, lease->lease().lease_id()), IsOk());
  ExpectHostLeasesDrain(0);
  EXPECT_THAT(ReleaseHost(later, lease->lease().lease_id()), StatusIs(absl::StatusCode::kNotFound));
  ::close(later.fd);

  // A process that exits with a lease held: given back once the process is gone.
  auto holder = Subprocess::Start(
      {SiblingBinary("api_peer"), "host-lease", socket_path(0), "m/" + tensors_[homed[1]].name});
  ASSERT_THAT(holder, IsOk());
  EXPECT_THAT((*holder)->ReadLine(kTimeout), IsOkAndHolds("held"));
  EXPECT_EQ(Stats(0).node_host_leases(), 1u);
  ASSERT_THAT((*holder)->WriteToStdin("exit\n"), IsOk());
  EXPECT_THAT((*holder)->Wait(kTimeout), IsOkAndHolds(0));
  ExpectHostLeasesDrain(0);
}

// What borrowers may hold of a home's host cache is bounded: a session its staging quota in bytes,
// all of them together half the cache (each object once). Past that a lease is refused, and the
// home's own clients still find room to store.
TEST_F(NodeHostTierTest, HostLeasesAreBoundedPerSessionAndForAllSessions) {
  WriteModel(32, 32);
  StartDaemons("4MiB", {"--session-max-staging-bytes=1536KiB"});
  const std::vector<size_t> homed = HomedOn(0);
  uint64_t homed_bytes = 0;
  for (size_t t : homed) homed_bytes += tensors_[t].data.size();
  ASSERT_GT(homed_bytes, 2u << 20) << "too little is homed on daemon 0 for this test";
  auto lease_until_refused = [&](RawSession& raw, uint64_t& held, bool backwards) -> absl::Status {
    for (size_t i = 0; i < homed.size(); ++i) {
      const size_t t = homed[backwards ? homed.size() - 1 - i : i];
      absl::StatusOr<v1::SessionResponse> lease = LeaseHost(raw, "m/" + tensors_[t].name);
      if (!lease.ok()) return lease.status();
      held += lease->lease().length();
    }
    return absl::OkStatus();
  };
  RawSession first = OpenAsNodeDaemon(0);
  uint64_t first_held = 0;
  const absl::Status quota = lease_until_refused(first, first_held, /*backwards=*/false);
  EXPECT_THAT(quota, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(quota.message()), ::testing::HasSubstr("--session-max-staging-bytes"));
  EXPECT_LE(first_held, 1536u << 10);
  // Another session leases others, until the two hold half the cache.
  RawSession second = OpenAsNodeDaemon(0);
  uint64_t second_held = 0;
  const absl::Status cap = lease_until_refused(second, second_held, /*backwards=*/true);
  EXPECT_THAT(cap, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(cap.message()), ::testing::HasSubstr("half the host cache"));
  EXPECT_LE(first_held + second_held, 2u << 20);
  // An object the first session holds is lent again without counting twice.
  RawSession third = OpenAsNodeDaemon(0);
  EXPECT_THAT(LeaseHost(third, "m/" + tensors_[homed[0]].name), IsOk());
  // The home's own clients still store and fetch.
  const std::string activations = testing::PatternBytes(1 << 20, 5);
  EXPECT_THAT(StoreBytes(session(0), "kv/x", activations), IsOk());
  EXPECT_THAT(FetchBytes(session(0), "kv/x"), IsOkAndHolds(activations));
  ::close(first.fd);
  ::close(second.fd);
  ::close(third.fd);
  // On the gRPC stream, whose peer process is not known, none is lent at all.
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kTimeout));
  auto stream = client(0).stub().Session(&context);
  v1::SessionRequest open = testing::OpenRequest(1, "node_host_tier_test over gRPC");
  open.mutable_open()->set_node_daemon(true);
  v1::SessionRequest request = testing::FetchRequestFor(2, "m/" + tensors_[homed[0]].name);
  request.mutable_fetch()->set_local_only(true);
  request.mutable_fetch()->set_host_lease(true);
  ASSERT_TRUE(stream->Write(open) && stream->Write(request));
  v1::SessionResponse answer;
  ASSERT_TRUE(stream->Read(&answer) && stream->Read(&answer));
  EXPECT_EQ(answer.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(answer.message(), ::testing::HasSubstr("session socket only"));
  stream->WritesDone();
  (void)stream->Finish();
}

TEST_F(NodeHostTierTest, HostLeasesNeedANode) {
  // A daemon without peers lends no host memory.
  std::vector<std::string> argv = {SiblingBinary("tierd"),
                                   absl::StrCat("--device=", testing::DeviceUnderTest().ToString()),
                                   absl::StrCat("--socket=", socket_path(0)),
                                   absl::StrCat("--state-dir=", dir_.path(), "/s"),
                                   "--host-cache-bytes=16MiB",
                                   "--gpu-pool-bytes=16MiB",
                                   "--gpu-slab-bytes=8MiB",
                                   "--shutdown-grace-ms=500"};
  auto daemon = testing::StartServingDaemon(argv, socket_path(0), kTimeout);
  ASSERT_THAT(daemon, IsOk());
  daemons_[0] = *std::move(daemon);
  ASSERT_THAT(client(0).RegisterModel("m", model_dir_, v1::GROUPING_TENSOR), IsOk());
  const int fd = testing::OpenSessionSocketSession(SessionSocketPathFor(socket_path(0)), "t");
  ASSERT_GE(fd, 0);
  v1::SessionRequest request = testing::FetchRequestFor(2, "m/w0");
  request.mutable_fetch()->set_host_lease(true);
  ASSERT_THAT(SendAll(fd, EncodeFrame(request)), IsOk());
  std::string payload;
  ASSERT_THAT(ReadFrame(fd, payload), IsOk());
  v1::SessionResponse answer;
  ASSERT_TRUE(answer.ParseFromString(payload));
  EXPECT_EQ(answer.code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(answer.message(), ::testing::HasSubstr("--peers"));
  ::close(fd);
  EXPECT_EQ(Stats(0).node_daemons(), 0u);
}

}  // namespace
}  // namespace tierd
