// The node host tier's leases across real daemon processes (the fixture of node_host_tier_test.cc):
// a host lease outlives the session it was lent on until its process releases it or exits, leases
// are bounded per session (what the process's ended sessions hold counted in) and for all
// sessions, and they need a node.
#include "absl/algorithm/container.h"
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

TEST_F(NodeHostTierTest, ALeaseWhoseSessionEndedIsHeldUntilItsProcessReleasesItOrExits) {
  WriteModel(32, 32);  // 128 to 512 KiB objects, 10 MiB: more than a 3 MiB host cache holds
  StartDaemons("3MiB");
  const int home = MostHomed();
  const std::vector<size_t> homed = HomedOn(home);
  ASSERT_GE(homed.size(), 4u);
  const TensorSpec& lent = tensors_[homed[0]];
  RawSession borrower = OpenAsNodeDaemon(home);
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
      EXPECT_THAT(FetchBytes(session(home), "m/" + tensors_[t].name),
                  IsOkAndHolds(tensors_[t].data));
    }
    (void)session(home).Evict("m/", v1::TIER_ALL);
  }
  EXPECT_GT(Stats(home).host().evictions(), 0u);
  EXPECT_EQ(lent_bytes(), lent.data) << "the lent range was read into while it was lent";
  EXPECT_EQ(Stats(home).node_host_leases(), 1u);
  EXPECT_EQ(Stats(home).node_host_leases_kept(), 1u);
  EXPECT_EQ(Stats(home).node_host_lent_bytes(), lent.data.size());

  // Another process cannot give it back; this one can, on a later session.
  RawSession later = OpenAsNodeDaemon(home);
  EXPECT_THAT(ReleaseHost(later, lease->lease().lease_id()), IsOk());
  ExpectHostLeasesDrain(home);
  EXPECT_THAT(ReleaseHost(later, lease->lease().lease_id()), StatusIs(absl::StatusCode::kNotFound));
  ::close(later.fd);

  // A process that exits with a lease held: given back once the process is gone.
  auto holder = Subprocess::Start(
      {SiblingBinary("api_peer"), "host-lease", socket_path(home), "m/" + tensors_[homed[1]].name});
  ASSERT_THAT(holder, IsOk());
  EXPECT_THAT((*holder)->ReadLine(kTimeout), IsOkAndHolds("held"));
  EXPECT_EQ(Stats(home).node_host_leases(), 1u);
  ASSERT_THAT((*holder)->WriteToStdin("exit\n"), IsOk());
  EXPECT_THAT((*holder)->Wait(kTimeout), IsOkAndHolds(0));
  ExpectHostLeasesDrain(home);
}

// What borrowers may hold of a home's host cache is bounded: a session its staging quota in bytes,
// all of them together half the cache (each object once). Past that a lease is refused, and the
// home's own clients still find room to store.
TEST_F(NodeHostTierTest, HostLeasesAreBoundedPerSessionAndForAllSessions) {
  WriteModel(32, 32);
  StartDaemons("4MiB", {"--session-max-staging-bytes=1536KiB"});
  const int home = MostHomed();
  const std::vector<size_t> homed = HomedOn(home);
  uint64_t homed_bytes = 0;
  for (size_t t : homed) homed_bytes += tensors_[t].data.size();
  ASSERT_GT(homed_bytes, 2u << 20) << "too little is homed on any daemon for this test";
  auto lease_until_refused = [&](RawSession& raw, uint64_t& held, bool backwards) -> absl::Status {
    for (size_t i = 0; i < homed.size(); ++i) {
      const size_t t = homed[backwards ? homed.size() - 1 - i : i];
      absl::StatusOr<v1::SessionResponse> lease = LeaseHost(raw, "m/" + tensors_[t].name);
      if (!lease.ok()) return lease.status();
      held += lease->lease().length();
    }
    return absl::OkStatus();
  };
  RawSession first = OpenAsNodeDaemon(home);
  uint64_t first_held = 0;
  const absl::Status quota = lease_until_refused(first, first_held, /*backwards=*/false);
  EXPECT_THAT(quota, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(quota.message()), ::testing::HasSubstr("--session-max-staging-bytes"));
  EXPECT_LE(first_held, 1536u << 10);
  // Another session leases others, until the two hold half the cache.
  RawSession second = OpenAsNodeDaemon(home);
  uint64_t second_held = 0;
  const absl::Status cap = lease_until_refused(second, second_held, /*backwards=*/true);
  EXPECT_THAT(cap, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(cap.message()), ::testing::HasSubstr("half the host cache"));
  EXPECT_LE(first_held + second_held, 2u << 20);
  // An object the first session holds is lent again without counting twice.
  RawSession third = OpenAsNodeDaemon(home);
  EXPECT_THAT(LeaseHost(third, "m/" + tensors_[homed[0]].name), IsOk());
  // The home's own clients still store and fetch.
  const std::string activations = testing::PatternBytes(1 << 20, 5);
  EXPECT_THAT(StoreBytes(session(home), "kv/x", activations), IsOk());
  EXPECT_THAT(FetchBytes(session(home), "kv/x"), IsOkAndHolds(activations));
  ::close(first.fd);
  ::close(second.fd);
  ::close(third.fd);
  // On the gRPC stream, whose peer process is not known, none is lent at all.
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kTimeout));
  auto stream = client(home).stub().Session(&context);
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

// A process that ends sessions holding their leases and opens new ones once held up to the cap of
// all sessions together: what its ended sessions left counts against the quota of its next.
TEST_F(NodeHostTierTest, ASessionsQuotaCountsWhatItsProcessesEndedSessionsHold) {
  WriteModel(32, 32);
  StartDaemons("8MiB", {"--session-max-staging-bytes=1MiB"});
  const int home = MostHomed();
  const std::vector<size_t> homed = HomedOn(home);
  ASSERT_GE(homed.size(), 6u);
  RawSession first = OpenAsNodeDaemon(home);
  std::vector<uint64_t> held;
  absl::Status refused;
  size_t next = 0;
  for (; next < homed.size(); ++next) {
    absl::StatusOr<v1::SessionResponse> lease = LeaseHost(first, "m/" + tensors_[homed[next]].name);
    if (!lease.ok()) {
      refused = lease.status();
      break;
    }
    held.push_back(lease->lease().lease_id());
  }
  ASSERT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted));
  ASSERT_FALSE(held.empty());
  ::close(first.fd);  // ended holding them: quarantined for this process
  ASSERT_TRUE(absl::c_any_of(std::vector<int>(50), [&](int) {
    absl::SleepFor(absl::Milliseconds(20));
    return Stats(home).node_host_leases_kept() == held.size();
  }));

  RawSession second = OpenAsNodeDaemon(home);
  absl::StatusOr<v1::SessionResponse> again = LeaseHost(second, "m/" + tensors_[homed[next]].name);
  EXPECT_THAT(again, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(again.status().message()), ::testing::HasSubstr("ended sessions"));
  // Given back, they count no more.
  for (uint64_t id : held) EXPECT_THAT(ReleaseHost(second, id), IsOk());
  EXPECT_THAT(LeaseHost(second, "m/" + tensors_[homed[next]].name), IsOk());
  ::close(second.fd);
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
