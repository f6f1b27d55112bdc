// ClientTable on its own: how many clients may be open, and what each may hold (its quotas), lease
// by lease and pin by pin.
#include "gpu/detail/client_table.h"

#include <memory>
#include <optional>

#include "absl/synchronization/mutex.h"
#include "device/host_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;

// Staging objects come from a residency table; this one's owner only makes them (nothing is in
// flight, evicted or allocated).
class ObjectsOnlyOwner : public StagingObjectTable::Owner {
 public:
  bool InFlight(const StagingObject&) const override { return false; }
  bool CanEvict(const StagingObject&) const override { return false; }
  void Evict(StagingObject&) override {}
  void Destroying(StagingObject&) override {}
  std::optional<StagingAllocation> AllocateFree(uint64_t) override { return std::nullopt; }
  bool WorthEvicting(uint64_t, uint64_t) override { return false; }
  bool RoomComing(uint64_t) override { return false; }
  absl::Status NoRoom(uint64_t, bool) override { return absl::ResourceExhaustedError("none"); }
};

class ClientTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = HostDevice::Create();
    ASSERT_THAT(device, IsOk());
    device_ = *std::move(device);
    table_ = std::make_unique<ClientTable>(mu_, *device_, /*max_clients=*/2);
    object_ = objects_.Create("s/object");
    object_->size = 100;
    other_ = objects_.Create("s/other");
    other_->size = 100;
  }

  ClientId Open(ClientLimits limits = {}) {
    absl::StatusOr<ClientId> id = table_->Open(limits, {/*done events=*/5, 6});
    EXPECT_THAT(id, IsOk());
    return id.value_or(0);
  }

  std::unique_ptr<Device> device_;
  absl::Mutex mu_;
  std::unique_ptr<ClientTable> table_;
  ObjectsOnlyOwner owner_;
  StagingObjectTable objects_{owner_, EvictionPolicy::kLru};
  StagingObject* object_ = nullptr;
  StagingObject* other_ = nullptr;
};

TEST_F(ClientTableTest, RefusesMoreClientsThanItsLimitUntilOneCloses) {
  const ClientId first = Open();
  Open();
  EXPECT_THAT(table_->Open({}, {}), StatusIs(absl::StatusCode::kResourceExhausted));
  {
    absl::MutexLock lock(&mu_);
    table_->Find(first)->closed = true;  // closed, still draining: no longer counts
    EXPECT_EQ(table_->Find(first), nullptr);
    EXPECT_NE(table_->FindAny(first), nullptr);
    EXPECT_EQ(table_->OpenCount(), 1u);
  }
  Open();
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(table_->Ids().size(), 3u);
  EXPECT_NE(table_->Erase(first), nullptr);
  EXPECT_EQ(table_->FindAny(first), nullptr);
}

TEST_F(ClientTableTest, LeaseQuotaIsPerClient) {
  ClientLimits one_lease;
  one_lease.max_leases = 1;
  const ClientId limited = Open(one_lease);
  const ClientId other = Open();
  absl::MutexLock lock(&mu_);
  GpuClient& a = *table_->Find(limited);
  GpuClient& b = *table_->Find(other);
  EXPECT_THAT(a.CheckLeaseQuota(), IsOk());
  GpuClient::Lease lease;
  lease.object = object_;
  table_->AddLease(a, lease);
  EXPECT_THAT(a.CheckLeaseQuota(), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(b.CheckLeaseQuota(), IsOk());
  ++a.pending_fetches;  // fetches under way count too
  a.leases.clear();
  EXPECT_THAT(a.CheckLeaseQuota(), StatusIs(absl::StatusCode::kResourceExhausted));
  object_->refs = 0;
}

TEST_F(ClientTableTest, ReleasingTellsUnknownLeasesFromReleasedOnes) {
  const ClientId id = Open();
  absl::MutexLock lock(&mu_);
  GpuClient& client = *table_->Find(id);
  GpuClient::Lease granted;
  granted.object = object_;
  granted.names_ready_event = true;
  const uint64_t lease = table_->AddLease(client, granted);
  EXPECT_EQ(object_->ready_event_leases, 1u);
  EXPECT_EQ(client.staging_bytes, 100u);
  EXPECT_EQ(object_->refs, 1);
  absl::StatusOr<GpuClient::Lease> taken = table_->TakeLease(client, lease);
  ASSERT_THAT(taken, IsOk());
  EXPECT_EQ(taken->object, object_);
  EXPECT_TRUE(taken->names_ready_event);
  // Only the client's own done events may be named in its releases.
  EXPECT_THAT(client.CheckDoneEvent(6), IsOk());
  EXPECT_THAT(client.CheckDoneEvent(7), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(client.staging_bytes, 0u);
  // The object's lease count drops when the lease's drain completes, not here.
  EXPECT_EQ(object_->refs, 1);
  EXPECT_THAT(table_->TakeLease(client, lease), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(table_->TakeLease(client, lease + 1), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(table_->TakeReservation(client, 1), StatusIs(absl::StatusCode::kFailedPrecondition));
  object_->refs = 0;
  object_->ready_event_leases = 0;
}

TEST_F(ClientTableTest, StagingQuotaCountsEachPinnedKeyOnce) {
  ClientLimits limits;
  limits.max_staging_bytes = 150;
  const ClientId id = Open(limits);
  absl::MutexLock lock(&mu_);
  GpuClient& client = *table_->Find(id);
  ASSERT_THAT(table_->AddPin(client, object_), IsOk());
  ASSERT_THAT(table_->AddPin(client, object_), IsOk());
  EXPECT_EQ(client.staging_bytes, 100u);
  EXPECT_EQ(object_->pins, 2);
  EXPECT_THAT(table_->AddPin(client, other_), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(other_->pins, 0);
  EXPECT_EQ(client.pins.count(other_->key()), 0u);

  StagingObject* newer = objects_.Create(object_->key());
  EXPECT_THAT(client.CheckPinnedVersion(object_->key(), object_), IsOk());
  EXPECT_THAT(client.CheckPinnedVersion(object_->key(), newer),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_FALSE(table_->DropPinOf(client, newer));

  EXPECT_EQ(table_->DropPin(client, object_->key()), object_);
  EXPECT_EQ(client.staging_bytes, 100u);  // one pin of the key is left
  EXPECT_TRUE(table_->DropPinOf(client, object_));
  EXPECT_EQ(client.staging_bytes, 0u);
  EXPECT_EQ(object_->pins, 0);
  EXPECT_TRUE(client.pins.empty());
}

}  // namespace
}  // namespace tierd
