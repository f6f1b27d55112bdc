// PeerLoader on its own, with a peer in this process: a PeerSource that lends objects from memory
// of its own, answering on a thread of its own as the node's daemons do. A lent object is copied
// in after the peer's ready event, leased, and given back to the peer once the copy has read it;
// nothing is kept. A key no peer has, and an object larger than a slab, are refused, and what was
// lent is given back.
#include "gpu/detail/peer_loader.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/worker_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gpu_parts_test_support.h"
#include "tests/gpu_tier_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::Answer;
using ::tierd::testing::FillPattern;
using ::tierd::testing::GpuLoaders;
using ::tierd::testing::GpuParts;
using ::tierd::testing::GpuPartsOptions;
using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;

constexpr uint64_t kObjectBytes = 64 << 10;
constexpr absl::Duration kBound = absl::Seconds(10);

// A peer lending objects from its own memory; answers on its own thread.
class InProcessPeer : public PeerSource {
 public:
  // Lends `key`: `bytes` of pattern `seed`; its bytes are there once `ready` (if not null) is.
  void Add(const std::string& key, uint64_t bytes, uint64_t seed, Event* ready = nullptr) {
    absl::MutexLock lock(&mu_);
    Object& object = objects_[key];
    object.bytes.resize(bytes);
    FillPattern(object.bytes.data(), bytes, seed);
    object.ready = ready;
  }
  uint8_t* data(const std::string& key) {
    absl::MutexLock lock(&mu_);
    return objects_[key].bytes.data();
  }

  void Fetch(const std::string& key, Callback done) override {
    thread_.Post([this, key, done = std::move(done)]() mutable { std::move(done)(Lend(key)); });
  }

  // Waits (bounded) until every lent object was given back; how many were lent.
  int AwaitAllReleased() {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](InProcessPeer* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                               return self->released_ == self->lent_;
                             },
                             this),
                         kBound);
    EXPECT_EQ(released_, lent_);
    return lent_;
  }

 private:
  absl::StatusOr<PeerCopy> Lend(const std::string& key) {
    absl::MutexLock lock(&mu_);
    auto it = objects_.find(key);
    if (it == objects_.end()) return absl::NotFoundError(key + ": no peer has it");
    PeerCopy copy;
    copy.data = it->second.bytes.data();
    copy.size = it->second.bytes.size();
    copy.ready = it->second.ready;
    copy.peer = "in-process peer";
    ++lent_;
    copy.release = [this] {
      absl::MutexLock relock(&mu_);
      ++released_;
    };
    return copy;
  }

  struct Object {
    std::vector<uint8_t> bytes;
    Event* ready = nullptr;
  };
  absl::Mutex mu_;
  std::map<std::string, Object> objects_ ABSL_GUARDED_BY(mu_);
  int lent_ ABSL_GUARDED_BY(mu_) = 0;
  int released_ ABSL_GUARDED_BY(mu_) = 0;
  WorkerPool thread_{1};  // last: its jobs end first
};

class PeerLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GpuPartsOptions options;
    options.pool_bytes = 4 * kObjectBytes;
    options.slab_bytes = 2 * kObjectBytes;
    auto parts = GpuParts::Create(options);
    ASSERT_THAT(parts, IsOk());
    parts_ = *std::move(parts);
    loaders_ = std::make_unique<GpuLoaders>(*parts_);
    peer_loader_ = std::make_unique<PeerLoader>(
        parts_->tier(), PeerLoader::Own{&peer_, loaders_->handoff_stream(), loaders_->loader()});
    peer_stream_ = parts_->NewStream();
    ASSERT_NE(peer_stream_, nullptr);
    absl::StatusOr<ClientId> client = parts_->OpenClient();
    ASSERT_THAT(client, IsOk());
    client_ = *client;
  }

  void TearDown() override {
    if (!go_.HasBeenNotified()) go_.Notify();
    EXPECT_TRUE(parts_->AwaitQuiet(
        [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return peer_loader_->in_flight() == 0; }));
    EXPECT_THAT(parts_->device().SynchronizeStream(*peer_stream_), IsOk());
    peer_.AwaitAllReleased();
    peer_loader_.reset();
    loaders_.reset();
    parts_.reset();
  }

  absl::StatusOr<LeaseGrant> Fetch(const std::string& key) {
    Answer<absl::StatusOr<LeaseGrant>> answer;
    {
      DeferredCalls deferred;
      absl::MutexLock lock(&parts_->mu);
      peer_loader_->Start(*parts_->clients().Find(client_), key, answer.Callback(),
                          deferred.calls());
    }
    return answer.Wait();
  }

  std::unique_ptr<GpuParts> parts_;
  std::unique_ptr<GpuLoaders> loaders_;
  InProcessPeer peer_;
  std::unique_ptr<PeerLoader> peer_loader_;
  Stream* peer_stream_ = nullptr;
  absl::Notification go_;
  ClientId client_ = 0;
};

TEST_F(PeerLoaderTest, ALentObjectIsCopiedInLeasedAndGivenBackOnceCopied) {
  peer_.Add("s/lent", kObjectBytes, 31);
  absl::StatusOr<LeaseGrant> lease = Fetch("s/lent");
  ASSERT_THAT(lease, IsOk());
  std::string expected(kObjectBytes, '\0');
  FillPattern(expected.data(), kObjectBytes, 31);
  EXPECT_TRUE(loaders_->Holds(*lease, expected));
  EXPECT_EQ(peer_.AwaitAllReleased(), 1);
  // The copy is counted once it is done (a little after the peer's buffer is given back).
  EXPECT_TRUE(parts_->AwaitQuiet([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return parts_->residency().copies_in_flight() == 0;
  }));
  {
    absl::MutexLock lock(&parts_->mu);
    EXPECT_EQ(parts_->residency().FindListed("s/lent"), nullptr);  // nothing is kept
    EXPECT_EQ(parts_->stats.peer_fetches, 1u);
    EXPECT_EQ(parts_->stats.bytes_peer_to_gpu, kObjectBytes);
  }
}

TEST_F(PeerLoaderTest, TheCopyWaitsForThePeersReadyEvent) {
  absl::StatusOr<uint32_t> ready = parts_->events().Acquire(EventUse::kDaemonRecords);
  ASSERT_THAT(ready, IsOk());
  Event& peer_ready = parts_->events().event(*ready);
  peer_.Add("s/late", kObjectBytes, 1, &peer_ready);
  // The peer writes the bytes the lease must see only once the test lets it, then records.
  uint8_t* peer_bytes = peer_.data("s/late");
  ASSERT_THAT(parts_->device().LaunchHostFunction(*peer_stream_,
                                                  [this, peer_bytes] {
                                                    go_.WaitForNotificationWithTimeout(kBound);
                                                    FillPattern(peer_bytes, kObjectBytes, 2);
                                                  }),
              IsOk());
  ASSERT_THAT(parts_->device().RecordEvent(peer_ready, *peer_stream_), IsOk());
  absl::StatusOr<LeaseGrant> lease = Fetch("s/late");
  ASSERT_THAT(lease, IsOk());
  ASSERT_TRUE(lease->ready_event.has_value());
  go_.Notify();
  std::string expected(kObjectBytes, '\0');
  FillPattern(expected.data(), kObjectBytes, 2);
  EXPECT_TRUE(loaders_->Holds(*lease, expected));
}

TEST_F(PeerLoaderTest, AKeyNoPeerHasIsNotFoundAndLeavesNothing) {
  EXPECT_THAT(Fetch("s/nowhere"), StatusIs(absl::StatusCode::kNotFound));
  absl::MutexLock lock(&parts_->mu);
  EXPECT_EQ(peer_loader_->in_flight(), 0u);
  EXPECT_EQ(parts_->clients().Find(client_)->pending_fetches, 0u);
}

TEST_F(PeerLoaderTest, AnObjectLargerThanASlabIsRefusedAndGivenBack) {
  peer_.Add("s/huge", 4 * kObjectBytes, 5);
  EXPECT_THAT(Fetch("s/huge"), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(peer_.AwaitAllReleased(), 1);
  EXPECT_EQ(parts_->pool().used_bytes(), 0u);
}

}  // namespace
}  // namespace tierd
