// Client groups (tierd --client-groups) against a tierd process: each group's sessions come in
// through its own socket (its Unix group, mode 0660), are handed the handles of its own staging
// slabs only, and see only its own stored objects, also after a restart; model weights are served
// to every group with their bytes. Bad --client-groups values are refused with exit status 2.
#include <grp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/tierd_client.h"
#include "device/device_factory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_test_support.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"
#include "wire/session_socket.h"
#include "wire/wire_format.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::tierd::testing::EvictOnceFree;
using ::tierd::testing::FetchBytes;
using ::tierd::testing::IsOk;
using ::tierd::testing::IsOkAndHolds;
using ::tierd::testing::RunProgram;
using ::tierd::testing::SiblingBinary;
using ::tierd::testing::StatusIs;
using ::tierd::testing::StoreBytes;
using ::tierd::testing::Subprocess;
using ::tierd::testing::TempDir;

constexpr absl::Duration kTimeout = absl::Seconds(30);

class ClientGroupsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The test's own group: the one group an unprivileged process can give its files.
    const struct group* group = ::getgrgid(::getgid());
    ASSERT_NE(group, nullptr);
    unix_group_ = group->gr_name;
    const std::string model = absl::StrCat(dir_.path(), "/model");
    ASSERT_EQ(::mkdir(model.c_str(), 0755), 0);
    for (int block = 0; block < 2; ++block) {
      tensors_.push_back(testing::RandomTensor(absl::StrCat("blocks.", block, ".w"), "F32",
                                               {128, 128}, 40 + block));
    }
    ASSERT_THAT(testing::WriteSafetensors(absl::StrCat(model, "/model.safetensors"), tensors_),
                IsOk());
    StartDaemon(GroupsFlag());
    ASSERT_NE(daemon_, nullptr);
    ASSERT_THAT(Connect("")->RegisterModel("m", model, v1::GROUPING_BLOCK), IsOk());
  }

  void TearDown() override { StopDaemon(); }

  std::string socket_path() const { return absl::StrCat(dir_.path(), "/gpu0.sock"); }
  std::string GroupsFlag() const {
    return absl::StrCat("--client-groups=tenant:", unix_group_, ":4MiB,other:", unix_group_,
                        ":2MiB");
  }
  std::vector<std::string> TierdArgs(const std::vector<std::string>& extra) const {
    std::vector<std::string> args = {
        SiblingBinary("tierd"),
        absl::StrCat("--device=", testing::DeviceUnderTest().ToString()),
        absl::StrCat("--socket=", socket_path()),
        absl::StrCat("--state-dir=", dir_.path(), "/state"),
        "--host-cache-bytes=32MiB",
        "--gpu-pool-bytes=4MiB",
        "--gpu-slab-bytes=2MiB"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  void StartDaemon(const std::string& groups_flag) {
    auto daemon = testing::StartServingDaemon(TierdArgs({groups_flag}), socket_path(), kTimeout);
    ASSERT_THAT(daemon, IsOk());
    daemon_ = *std::move(daemon);
  }
  void StopDaemon() {
    clients_.clear();
    if (daemon_ == nullptr) return;
    daemon_->Signal(SIGTERM);
    EXPECT_THAT(daemon_->Wait(kTimeout), IsOkAndHolds(0));
    daemon_.reset();
  }

  // A client of `group` ("": the default group); kept until the daemon stops.
  Client* Connect(const std::string& group) {
    ClientOptions options;
    options.socket_path = socket_path();
    options.client_group = group;
    auto client = Client::Connect(options);
    EXPECT_THAT(client, IsOk());
    if (!client.ok()) return nullptr;
    clients_.push_back(*std::move(client));
    return clients_.back().get();
  }
  std::unique_ptr<Session> Open(const std::string& group) {
    auto session = Connect(group)->OpenSession();
    EXPECT_THAT(session, IsOk()) << group;
    return session.ok() ? *std::move(session) : nullptr;
  }

  // The handles of `kind` a session on the session socket at `path` is handed when it opens and
  // fetches `key`: the raw protocol, to see exactly what crosses the socket.
  std::set<std::string> HandlesHandedOut(const std::string& path, const std::string& key,
                                         v1::Handle::Kind kind) {
    std::set<std::string> handles;
    const int fd = testing::ConnectUnix(path);
    v1::SessionRequest open;
    open.set_request_id(1);
    open.mutable_open()->set_client_name("raw");
    open.mutable_open()->set_protocol(SessionProtocolVersion());
    v1::SessionRequest fetch;
    fetch.set_request_id(2);
    fetch.mutable_fetch()->set_key(key);
    EXPECT_THAT(
        SendAll(fd, absl::StrCat(SessionSocketHello(), EncodeFrame(open), EncodeFrame(fetch))),
        IsOk());
    std::string greeting(SessionSocketHello().size(), '\0');
    EXPECT_THAT(ReadExactly(fd, greeting.data(), greeting.size()), IsOk());
    for (int answers = 0; answers < 2; ++answers) {
      std::string payload;
      EXPECT_THAT(ReadFrame(fd, payload), IsOk());
      v1::SessionResponse response;
      EXPECT_TRUE(response.ParseFromString(payload));
      EXPECT_EQ(response.code(), 0) << response.message();
      for (const v1::Handle& handle : response.new_handles()) {
        if (handle.kind() == kind) handles.insert(handle.handle());
      }
    }
    ::close(fd);  // ends the session, releasing its lease
    return handles;
  }
  std::set<std::string> SlabHandlesHandedOut(const std::string& path, const std::string& key) {
    return HandlesHandedOut(path, key, v1::Handle::SLAB);
  }

  TempDir dir_;
  std::string unix_group_;
  std::vector<testing::TensorSpec> tensors_;
  std::unique_ptr<Subprocess> daemon_;
  std::vector<std::unique_ptr<Client>> clients_;
};

TEST_F(ClientGroupsTest, EachGroupHasItsOwnSocketSlabsAndGpuCopies) {
  for (const char* group : {"tenant", "other"}) {
    const std::string path = ClientGroupSocketPathFor(socket_path(), group);
    struct stat st;
    ASSERT_EQ(::stat(path.c_str(), &st), 0) << path;
    EXPECT_TRUE(S_ISSOCK(st.st_mode)) << path;
    EXPECT_EQ(st.st_mode & 0777, 0660u) << path;
    EXPECT_EQ(st.st_gid, ::getgid()) << path;
  }
  // Weights are served to every group with their bytes, each from a GPU copy of its own.
  for (const char* group : {"", "tenant", "other"}) {
    std::unique_ptr<Session> session = Open(group);
    ASSERT_NE(session, nullptr);
    EXPECT_STREQ(session->transport(), "socket");
    EXPECT_THAT(FetchBytes(*session, "m/blocks.0"), IsOkAndHolds(tensors_[0].data)) << group;
  }
  auto stats = Connect("")->GetStats();
  ASSERT_THAT(stats, IsOk());
  ASSERT_EQ(stats->client_groups_size(), 3);
  const uint64_t budgets[] = {4u << 20, 4u << 20, 2u << 20};
  const char* names[] = {"default", "tenant", "other"};
  for (int i = 0; i < 3; ++i) {
    const v1::ClientGroupStats& group = stats->client_groups(i);
    EXPECT_EQ(group.name(), names[i]);
    EXPECT_EQ(group.gpu().budget_bytes(), budgets[i]) << names[i];
    EXPECT_EQ(group.gpu().objects(), 1u) << names[i];  // its own copy of m/blocks.0
    EXPECT_GE(group.slabs(), 1u) << names[i];
  }
  EXPECT_EQ(stats->gpu().budget_bytes(), 10u << 20);  // the sum
  EXPECT_EQ(stats->gpu().objects(), 3u);
  auto shown = RunProgram(
      {SiblingBinary("tierctl"), absl::StrCat("--socket=", socket_path()), "stats"}, kTimeout);
  ASSERT_THAT(shown, IsOk());
  EXPECT_EQ(shown->exit_code, 0);
  EXPECT_THAT(shown->output, HasSubstr("client group tenant: GPU tier"));

  // What crosses each socket: slab handles of that group's pool, never another's.
  const std::set<std::string> default_slabs =
      SlabHandlesHandedOut(SessionSocketPathFor(socket_path()), "m/blocks.1");
  const std::set<std::string> tenant_slabs =
      SlabHandlesHandedOut(ClientGroupSocketPathFor(socket_path(), "tenant"), "m/blocks.1");
  ASSERT_FALSE(default_slabs.empty());
  ASSERT_FALSE(tenant_slabs.empty());
  for (const std::string& slab : tenant_slabs) EXPECT_EQ(default_slabs.count(slab), 0u);
}

// Interprocess events are a group's own too. A client may keep the handles of its closed sessions
// and record those events whenever it likes: were they another group's ready events now, that
// group's readers would pass their wait before the copy landed. Here a client of group "other"
// records every event handle its sessions were ever handed, in a loop, while the tenant fetches
// objects that each need a copy: the tenant reads the right bytes every time, and no handle the
// tenant is handed was ever another group's.
TEST_F(ClientGroupsTest, AGroupsEventsAreNeverHandedToAnotherGroup) {
  // Blocks of 512 KiB: the groups' pools (4 MiB, 2 MiB) hold a few, so fetches in turn copy.
  const std::string big = absl::StrCat(dir_.path(), "/big");
  ASSERT_EQ(::mkdir(big.c_str(), 0755), 0);
  std::vector<testing::TensorSpec> blocks;
  for (int block = 0; block < 12; ++block) {
    blocks.push_back(testing::RandomTensor(absl::StrCat("blocks.", block, ".w"), "F32", {128, 1024},
                                           70 + block));
  }
  ASSERT_THAT(testing::WriteSafetensors(absl::StrCat(big, "/model.safetensors"), blocks), IsOk());
  ASSERT_THAT(Connect("")->RegisterModel("big", big, v1::GROUPING_BLOCK), IsOk());
  const std::string other_path = ClientGroupSocketPathFor(socket_path(), "other");
  const std::string tenant_path = ClientGroupSocketPathFor(socket_path(), "tenant");

  // The other group's sessions come and go, each fetching (a copy, with a ready event).
  std::set<std::string> others;
  for (int i = 0; i < 12; ++i) {
    for (const std::string& handle :
         HandlesHandedOut(other_path, absl::StrCat("big/blocks.", i), v1::Handle::EVENT)) {
      others.insert(handle);
    }
  }
  ASSERT_GE(others.size(), 5u);  // done events and ready events

  // ... and one of its clients records all of them, over and over.
  auto device = CreateDevice(testing::DeviceUnderTest());
  ASSERT_THAT(device, IsOk());
  std::vector<std::unique_ptr<Event>> stolen;
  for (const std::string& handle : others) {
    auto event = (*device)->OpenEvent(handle);
    ASSERT_THAT(event, IsOk());
    stolen.push_back(*std::move(event));
  }
  auto stream = (*device)->CreateStream(StreamPriority::kNormal);
  ASSERT_THAT(stream, IsOk());
  std::atomic<bool> stop{false};
  std::thread recorder([&] {
    while (!stop.load()) {
      for (const auto& event : stolen) (void)(*device)->RecordEvent(*event, **stream);
      (void)(*device)->SynchronizeStream(**stream);
    }
  });

  std::unique_ptr<Session> tenant = Open("tenant");
  ASSERT_NE(tenant, nullptr);
  int wrong = 0;
  for (int i = 0; i < 60; ++i) {
    const int block = i % 12;
    absl::StatusOr<std::string> bytes = FetchBytes(*tenant, absl::StrCat("big/blocks.", block));
    ASSERT_THAT(bytes, IsOk());
    if (*bytes != blocks[block].data) ++wrong;
  }
  stop = true;
  recorder.join();
  EXPECT_EQ(wrong, 0) << "fetches whose bytes were read before their copy landed";
  // What crosses the tenant's socket names none of the other group's events.
  for (int i = 0; i < 4; ++i) {
    for (const std::string& handle :
         HandlesHandedOut(tenant_path, absl::StrCat("big/blocks.", i), v1::Handle::EVENT)) {
      EXPECT_EQ(others.count(handle), 0u) << "the tenant was handed another group's event";
    }
  }
}

TEST_F(ClientGroupsTest, StoredObjectsAreSeenOnlyByTheGroupThatStoredThem) {
  std::unique_ptr<Session> tenant = Open("tenant");
  std::unique_ptr<Session> other = Open("other");
  std::unique_ptr<Session> main = Open("");
  ASSERT_TRUE(tenant && other && main);
  const std::string tenants = testing::PatternBytes(64 << 10, 1);
  const std::string mains = testing::PatternBytes(32 << 10, 2);
  ASSERT_THAT(StoreBytes(*tenant, "kv/x", tenants), IsOk());
  // Another group neither fetches nor prefetches it, not even to learn that it exists.
  EXPECT_THAT(FetchBytes(*main, "kv/x"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(FetchBytes(*other, "kv/x"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(other->Prefetch({"kv/x"}), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(other->Evict("kv/x", v1::TIER_ALL), StatusIs(absl::StatusCode::kNotFound));
  // The same key in two groups is two objects.
  ASSERT_THAT(StoreBytes(*main, "kv/x", mains), IsOk());
  EXPECT_THAT(FetchBytes(*tenant, "kv/x"), IsOkAndHolds(tenants));
  EXPECT_THAT(FetchBytes(*main, "kv/x"), IsOkAndHolds(mains));
  // Evicting a prefix from every tier (a delete) on the main socket leaves the tenant's alone.
  auto evicted = Connect("")->Evict("kv/", v1::TIER_ALL);
  ASSERT_THAT(evicted, IsOk());
  EXPECT_EQ(evicted->evicted(), 1u);
  EXPECT_THAT(FetchBytes(*main, "kv/x"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(FetchBytes(*tenant, "kv/x"), IsOkAndHolds(tenants));
  // Out of memory and back: the tenant's object comes back to the tenant only.
  for (v1::Tier tier : {v1::TIER_GPU, v1::TIER_HOST}) {
    // The last fetch's lease is released once its read is done; until then it stays.
    absl::StatusOr<v1::EvictResponse> gone = EvictOnceFree(*tenant, "kv/x", tier);
    ASSERT_THAT(gone, IsOk()) << v1::Tier_Name(tier);
    EXPECT_EQ(gone->evicted(), 1u) << v1::Tier_Name(tier);
  }
  EXPECT_THAT(FetchBytes(*tenant, "kv/x"), IsOkAndHolds(tenants));
  EXPECT_THAT(FetchBytes(*other, "kv/x"), StatusIs(absl::StatusCode::kNotFound));
  // The tenant deletes it, once the fetch's copy has been seen done.
  ASSERT_THAT(EvictOnceFree(*tenant, "kv/x", v1::TIER_ALL), IsOk());
  EXPECT_THAT(FetchBytes(*tenant, "kv/x"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(ClientGroupsTest, RetainedSetsBelongToTheirGroup) {
  std::unique_ptr<Session> tenant = Open("tenant");
  std::unique_ptr<Session> other = Open("other");
  std::unique_ptr<Session> main = Open("");
  ASSERT_TRUE(tenant && other && main);
  ASSERT_THAT(StoreBytes(*tenant, "proc/a", testing::PatternBytes(64 << 10, 3)), IsOk());
  ASSERT_THAT(tenant->Retain("m"), IsOk());
  ASSERT_THAT(tenant->Retain("proc/"), IsOk());
  // Another group neither sees, sleeps nor releases the tenant's sets, nor retains its objects.
  for (Session* stranger : {other.get(), main.get()}) {
    auto listed = stranger->ListRetained();
    ASSERT_THAT(listed, IsOk());
    EXPECT_EQ(listed->sets_size(), 0);
    EXPECT_THAT(stranger->Unretain("m"), StatusIs(absl::StatusCode::kNotFound));
    EXPECT_THAT(stranger->Sleep("m"), StatusIs(absl::StatusCode::kNotFound));
    EXPECT_THAT(stranger->Wake("proc/"), StatusIs(absl::StatusCode::kNotFound));
    EXPECT_THAT(stranger->Retain("proc/"), StatusIs(absl::StatusCode::kNotFound));
    EXPECT_THAT(stranger->Retain("proc/a"), StatusIs(absl::StatusCode::kNotFound));
  }
  // The tenant's sets take its own pool's budget (half of 4 MiB), never another group's.
  auto stats = Connect("")->GetStats();
  ASSERT_THAT(stats, IsOk());
  ASSERT_EQ(stats->client_groups_size(), 3);
  EXPECT_EQ(stats->client_groups(0).retained_sets(), 0u);
  EXPECT_EQ(stats->client_groups(1).name(), "tenant");
  EXPECT_EQ(stats->client_groups(1).retained_sets(), 2u);
  EXPECT_EQ(stats->client_groups(1).retain_budget_bytes(), 2u << 20);
  EXPECT_EQ(stats->client_groups(2).retain_budget_bytes(), 1u << 20);
  EXPECT_EQ(stats->retained_sets(), 2u);
  // The other group retains the same model into its own pool.
  ASSERT_THAT(other->Retain("m"), IsOk());
  auto after = Connect("")->GetStats();
  ASSERT_THAT(after, IsOk());
  EXPECT_EQ(after->client_groups(2).retained_sets(), 1u);
  EXPECT_EQ(after->retained_sets(), 3u);
}

TEST_F(ClientGroupsTest, DurableObjectsComeBackToTheirGroupOnly) {
  StoreRequest durable;
  durable.durable = true;
  const std::string bytes = testing::PatternBytes(48 << 10, 3);
  {
    std::unique_ptr<Session> tenant = Open("tenant");
    ASSERT_NE(tenant, nullptr);
    ASSERT_THAT(StoreBytes(*tenant, "kv/d", bytes, durable), IsOk());
  }
  // Restarted without the group: the object stays on disk and nobody is served it.
  StopDaemon();
  StartDaemon("--client-groups=");
  ASSERT_NE(daemon_, nullptr);
  {
    std::unique_ptr<Session> main = Open("");
    ASSERT_NE(main, nullptr);
    EXPECT_THAT(FetchBytes(*main, "kv/d"), StatusIs(absl::StatusCode::kNotFound));
    auto stats = Connect("")->GetStats();
    ASSERT_THAT(stats, IsOk());
    EXPECT_EQ(stats->durable_objects(), 1u);
    EXPECT_EQ(stats->client_groups_size(), 0);
  }
  // With the group again, after a SIGKILL: back to the tenant, and to nobody else.
  StopDaemon();
  StartDaemon(GroupsFlag());
  ASSERT_NE(daemon_, nullptr);
  daemon_->Signal(SIGKILL);
  ASSERT_THAT(daemon_->Wait(kTimeout), IsOk());
  daemon_.reset();
  clients_.clear();
  StartDaemon(GroupsFlag());
  ASSERT_NE(daemon_, nullptr);
  std::unique_ptr<Session> tenant = Open("tenant");
  std::unique_ptr<Session> other = Open("other");
  std::unique_ptr<Session> main = Open("");
  ASSERT_TRUE(tenant && other && main);
  EXPECT_THAT(FetchBytes(*tenant, "kv/d"), IsOkAndHolds(bytes));
  EXPECT_THAT(FetchBytes(*other, "kv/d"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(FetchBytes(*main, "kv/d"), StatusIs(absl::StatusCode::kNotFound));
}

// A client stores objects under a name before a model of that name is registered: from then on
// the keys name the model's weights only, for every group and for the daemons that borrow from
// this one. Planted bytes (even 100 of them for a tensor of 64 KiB) are never served as weights,
// and what was planted is gone from every tier, the durable store included.
TEST_F(ClientGroupsTest, ObjectsStoredUnderAModelsNameBeforeItsRegistrationAreNeverItsWeights) {
  const std::string model = absl::StrCat(dir_.path(), "/model");
  StoreRequest durable;
  durable.durable = true;
  {
    std::unique_ptr<Session> main = Open("");
    std::unique_ptr<Session> tenant = Open("tenant");
    ASSERT_TRUE(main && tenant);
    ASSERT_THAT(StoreBytes(*main, "later/blocks.0", std::string(100, 'p')), IsOk());
    ASSERT_THAT(StoreBytes(*main, "later/blocks.1", std::string(100, 'q'), durable), IsOk());
    ASSERT_THAT(StoreBytes(*tenant, "later/blocks.0", std::string(64 << 10, 't'), durable), IsOk());
    ASSERT_THAT(StoreBytes(*tenant, "later/other", std::string(100, 'o')), IsOk());
    // A session holding a lease of the plant across the registration keeps its bytes.
    auto held = main->Fetch("later/blocks.0");
    ASSERT_THAT(held, IsOk());
    ASSERT_THAT(Connect("")->RegisterModel("later", model, v1::GROUPING_BLOCK), IsOk());
    EXPECT_EQ(testing::LeaseBytes(*main, *held), std::string(100, 'p'));
  }
  auto weights_everywhere = [&] {
    for (const char* group : {"", "tenant", "other"}) {
      std::unique_ptr<Session> session = Open(group);
      ASSERT_NE(session, nullptr);
      EXPECT_THAT(FetchBytes(*session, "later/blocks.0"), IsOkAndHolds(tensors_[0].data)) << group;
      EXPECT_THAT(FetchBytes(*session, "later/blocks.1"), IsOkAndHolds(tensors_[1].data)) << group;
      // Keys the model does not have are no stored objects either.
      EXPECT_THAT(FetchBytes(*session, "later/other"), StatusIs(absl::StatusCode::kNotFound))
          << group;
    }
  };
  weights_everywhere();
  auto stats = Connect("")->GetStats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->durable_objects(), 0u) << "the planted durable objects are still on disk";
  // Nor do they come back with a restart.
  StopDaemon();
  StartDaemon(GroupsFlag());
  ASSERT_NE(daemon_, nullptr);
  weights_everywhere();
  // And nothing can be stored there now.
  std::unique_ptr<Session> main = Open("");
  ASSERT_NE(main, nullptr);
  EXPECT_THAT(StoreBytes(*main, "later/blocks.0", "x"),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(ClientGroupsTest, AClientOfAGroupTheDaemonLacksGetsNoSessionAtAll) {
  ClientOptions options;
  options.socket_path = socket_path();
  options.client_group = "absent";
  auto client = Client::Connect(options);
  ASSERT_THAT(client, IsOk());
  // Not the default group's session instead: an error.
  auto session = (*client)->OpenSession();
  EXPECT_FALSE(session.ok());
  EXPECT_THAT(std::string(session.status().message()), HasSubstr("client group absent"));
}

TEST_F(ClientGroupsTest, BadClientGroupsAreRefused) {
  StopDaemon();
  const std::string group = unix_group_;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--client-groups=tenant", "three or four fields"},
      {absl::StrCat("--client-groups=a:", group, ":1MiB:2MiB"), "at most the GPU pool's"},
      {absl::StrCat("--client-groups=a:", group, ":1MiB:lots"), "retained bytes"},
      {absl::StrCat("--client-groups=ten/ant:", group, ":1MiB"), "the name"},
      {absl::StrCat("--client-groups=default:", group, ":1MiB"), "main sockets"},
      {absl::StrCat("--client-groups=a:", group, ":0"), "above 0"},
      {absl::StrCat("--client-groups=a:", group, ":lots"), "above 0"},
      {absl::StrCat("--client-groups=a:", group, ":1MiB,a:", group, ":1MiB"), "twice"},
      {"--client-groups=a:no-such-group-tierd:1MiB", "no Unix group"},
  };
  // stderr is merged into the output so that the message can be checked (no argument here has
  // a space or a quote in it).
  auto run_tierd = [&](const std::vector<std::string>& extra) {
    return RunProgram(
        {"/bin/sh", "-c", absl::StrCat(absl::StrJoin(TierdArgs(extra), " "), " 2>&1")}, kTimeout);
  };
  for (const auto& [flag, why] : cases) {
    auto run = run_tierd({flag});
    ASSERT_THAT(run, IsOk());
    EXPECT_EQ(run->exit_code, 2) << flag << ": " << run->output;
    EXPECT_THAT(run->output, HasSubstr(why)) << flag;
  }
  auto no_session_socket =
      run_tierd({absl::StrCat("--client-groups=a:", group, ":1MiB"), "--session-socket="});
  ASSERT_THAT(no_session_socket, IsOk());
  EXPECT_EQ(no_session_socket->exit_code, 2) << no_session_socket->output;
  EXPECT_THAT(no_session_socket->output, HasSubstr("needs the session socket"));
}

}  // namespace
}  // namespace tierd
