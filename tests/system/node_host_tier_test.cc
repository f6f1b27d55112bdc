// The node's host tier (tierd --peers, docs/NODE.md) across real daemon processes on the device
// under test: each model object is read from disk and kept in host memory by its home daemon
// only, and the others copy it to their GPU from the home's host arena. On the CUDA build the
// daemons share GPU 0, which runs the same protocol (a peer's arena mapped and registered with
// each daemon's own CUDA context) as several GPUs do.
#include "tests/system/node_host_tier_test_fixture.h"

namespace tierd {
namespace {

using node_host_tier_test::kDaemons;
using node_host_tier_test::kTimeout;
using node_host_tier_test::NodeHostTierTest;
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

// Tensor-parallel ranks, one per daemon, each fetching its shard of every tensor (half split
// along dimension 0, half along dimension 1): the node reads each byte of the checkpoint from
// disk once, raw reads included, and holds it once in host memory. A dim-0 shard is its own
// contiguous range, read by its home; a dim-1 shard (a slice of every 4 KiB row, 1.3 KiB here)
// would read every row's block once per rank, so the whole tensor is read once, by its home,
// and each rank's slice is cut from it on the way to the GPU. Every daemon then fetching every
// rank's shards reads nothing more.
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
  uint64_t disk = 0, raw = 0, held = 0, held_objects = 0, cut = 0;
  for (int i = 0; i < kDaemons; ++i) {
    const v1::Stats stats = Stats(i);
    disk += stats.bytes_disk_to_host();
    raw += stats.disk_bytes_read();
    held += stats.host().used_bytes();
    held_objects += stats.host().objects();
    cut += stats.shards_cut();
  }
  EXPECT_EQ(disk, model_bytes_);
  // What the disk read, whole blocks: each tensor's first and last block may hold a neighbour's
  // bytes too.
  EXPECT_GE(raw, model_bytes_);
  EXPECT_LE(raw, model_bytes_ + tensors_.size() * 2 * 4096);
  // Host memory holds the dim-1 tensors whole and the dim-0 shards, each allocation with at most
  // a page before its bytes (where the read's aligned window starts).
  EXPECT_EQ(held_objects, tensors_.size() / 2 * (1 + kDaemons));
  EXPECT_GE(held, model_bytes_);
  EXPECT_LE(held, model_bytes_ + held_objects * 4096);
  EXPECT_EQ(cut, tensors_.size() / 2 * kDaemons) << "every dim-1 shard is cut from its tensor";

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

}  // namespace
}  // namespace tierd
