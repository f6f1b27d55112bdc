// Session::FetchMany end to end: a step's releases and fetches in one write, against a real daemon
// process, over the session socket and the gRPC stream.
#include "tests/system/api_test_fixture.h"

namespace tierd {
namespace api_test {
namespace {

// The fixture's daemon grants a session three leases at once (--session-max-leases=3).
constexpr int kQuota = 3;

std::vector<std::string> Keys(int first, int count) {
  std::vector<std::string> keys;
  for (int i = 0; i < count; ++i) keys.push_back(absl::StrCat("m/blocks.", (first + i) % kBlocks));
  return keys;
}

class FetchManyTest : public ApiTest {
 protected:
  // A session over the session socket (`socket`) or the gRPC stream.
  std::unique_ptr<Client> ClientOver(bool socket) {
    ClientOptions options;
    options.socket_path = socket_path();
    if (!socket) options.session_socket_path = "";
    auto client = Client::Connect(options);
    EXPECT_THAT(client, IsOk());
    return client.ok() ? *std::move(client) : nullptr;
  }
};

TEST_F(FetchManyTest, EachStepReleasesTheLastOneAndLeasesItsKeysInOrder) {
  for (const bool socket : {true, false}) {
    SCOPED_TRACE(socket ? "session socket" : "gRPC stream");
    std::unique_ptr<Client> client = ClientOver(socket);
    ASSERT_NE(client, nullptr);
    auto session = client->OpenSession();
    ASSERT_THAT(session, IsOk());
    EXPECT_STREQ((*session)->transport(), socket ? "socket" : "grpc");
    Stream& stream = (*session)->default_stream();
    // Each step holds the quota; its releases must reach the daemon before its fetches, or the
    // fetches would be refused. The pool holds four objects: steps evict each other's.
    std::vector<Lease> held;
    for (int step = 0; step < 4; ++step) {
      const std::vector<std::string> keys = Keys(step * kQuota, kQuota);
      auto leases = (*session)->FetchMany(keys, stream, std::move(held));
      ASSERT_THAT(leases, IsOk()) << "step " << step;
      ASSERT_EQ(leases->size(), keys.size());
      for (size_t i = 0; i < keys.size(); ++i) {
        EXPECT_EQ((*leases)[i].key(), keys[i]);
        ExpectTensorsMatch(**session, (*leases)[i]);
      }
      held = *std::move(leases);
    }
    // The last step's leases are held; the earlier ones' drain as their done events complete.
    EXPECT_TRUE(WaitForStats(
        [](const v1::Stats& stats) { return stats.leases() == static_cast<uint64_t>(kQuota); },
        kTimeout));
    held.clear();  // each releases itself
    EXPECT_TRUE(WaitForStats([](const v1::Stats& stats) { return stats.leases() == 0; }, kTimeout));
  }
  EXPECT_GT(Stats().gpu().evictions(), 0u);
}

TEST_F(FetchManyTest, OneFailedFetchReleasesTheOthersAndNamesItsKey) {
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  Stream& stream = (*session)->default_stream();
  auto leases = (*session)->FetchMany({Key(0), "m/no_such_block", Key(1)}, stream);
  EXPECT_THAT(leases, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(std::string(leases.status().message()), HasSubstr("m/no_such_block: "));
  EXPECT_TRUE(WaitForStats([](const v1::Stats& stats) { return stats.leases() == 0; }, kTimeout));
  // Over the quota: the fetches past it are refused, and nothing stays held.
  leases = (*session)->FetchMany(Keys(0, kQuota + 1), stream);
  EXPECT_THAT(leases, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_TRUE(WaitForStats([](const v1::Stats& stats) { return stats.leases() == 0; }, kTimeout));
  // The session goes on.
  leases = (*session)->FetchMany(Keys(2, kQuota), stream);
  ASSERT_THAT(leases, IsOk());
  for (const Lease& lease : *leases) ExpectTensorsMatch(**session, lease);
}

TEST_F(FetchManyTest, NothingToFetchOnlyReleases) {
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  Stream& stream = (*session)->default_stream();
  auto leases = (*session)->FetchMany(Keys(0, 2), stream);
  ASSERT_THAT(leases, IsOk());
  EXPECT_TRUE(WaitForStats([](const v1::Stats& stats) { return stats.leases() == 2; }, kTimeout));
  auto none = (*session)->FetchMany({}, stream, *std::move(leases));
  ASSERT_THAT(none, IsOk());
  EXPECT_TRUE(none->empty());
  EXPECT_TRUE(WaitForStats([](const v1::Stats& stats) { return stats.leases() == 0; }, kTimeout));
}

TEST_F(FetchManyTest, AfterTheDaemonIsGoneEveryFetchIsUnavailable) {
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  daemon_->Signal(SIGKILL);
  EXPECT_THAT(daemon_->Wait(kTimeout), ::tierd::testing::IsOkAndHolds(128 + SIGKILL));
  daemon_.reset();
  auto leases = (*session)->FetchMany(Keys(0, 2), (*session)->default_stream());
  EXPECT_THAT(leases, StatusIs(absl::StatusCode::kUnavailable));
}

}  // namespace
}  // namespace api_test
}  // namespace tierd
