// Many client processes holding many leases at once against one daemon: far more leases than the
// daemon has interprocess events, every one answered with the right bytes, nothing left behind.
#include <memory>
#include <string>
#include <vector>

#include "tests/system/api_test_fixture.h"

namespace tierd {
namespace api_test {
namespace {

constexpr int kClients = 8;
constexpr int kLeasesEach = 24;
constexpr int kMaxEvents = 32;

class ApiManyClientsTest : public ApiTest {
 protected:
  ApiManyClientsTest() {
    // Room for the four objects every client leases, and for each client's store after.
    extra_args_ = {"--gpu-pool-bytes=4MiB",
                   absl::StrCat("--max-events=", kMaxEvents),
                   "--session-done-events=2",
                   "--session-max-leases=64",
                   "--session-max-staging-bytes=64MiB",
                   absl::StrCat("--max-sessions=", kClients + 4)};
  }
};

TEST_F(ApiManyClientsTest, ClientsHoldFarMoreLeasesThanTheDaemonHasEvents) {
  static_assert(kClients * kLeasesEach > 4 * kMaxEvents, "the old limit: an event per lease");
  std::vector<std::unique_ptr<Subprocess>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(StartPeer({"hold-many", "m", expected_dir(), absl::StrCat(kLeasesEach)}));
    ASSERT_NE(clients.back(), nullptr);
  }
  for (auto& client : clients) {
    absl::StatusOr<std::string> line = client->ReadLine(kTimeout);
    ASSERT_THAT(line, IsOk());
    ASSERT_EQ(*line, "holding");
  }
  const v1::Stats holding = Stats();
  EXPECT_EQ(holding.leases(), static_cast<uint64_t>(kClients * kLeasesEach));
  EXPECT_EQ(holding.events_max(), static_cast<uint64_t>(kMaxEvents));
  EXPECT_LE(holding.events(), static_cast<uint64_t>(kMaxEvents));
  // Each session's two done events, and at most a ready event per object still being copied.
  EXPECT_LE(holding.events_in_use(), static_cast<uint64_t>(kClients * 2 + 4));
  EXPECT_EQ(holding.event_shortfalls(), 0u);

  for (auto& client : clients) ASSERT_THAT(client->WriteToStdin("go\n"), IsOk());
  for (auto& client : clients) {
    EXPECT_THAT(client->Wait(kTimeout), ::tierd::testing::IsOkAndHolds(0));
  }
  // Every lease, reservation, session and event is given back.
  EXPECT_TRUE(WaitForStats(
      [](const v1::Stats& stats) {
        return stats.leases() == 0 && stats.reservations() == 0 && stats.sessions() == 0 &&
               stats.events_in_use() == 0;
      },
      kTimeout))
      << Stats().DebugString();
}

}  // namespace
}  // namespace api_test
}  // namespace tierd
