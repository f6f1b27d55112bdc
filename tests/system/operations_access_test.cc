// tierd as an operator runs it (operations_test's second half): who may reach the sockets and the
// models, and how the daemon ends, killed or stopped with SIGTERM while clients work.
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/health.h"
#include "client/tierd_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_test_support.h"
#include "tests/storage_test_support.h"
#include "tests/system/operations_test_fixture.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::tierd::testing::IsOk;
using ::tierd::testing::IsOkAndHolds;
using ::tierd::testing::RunProgram;
using ::tierd::testing::SiblingBinary;
using ::tierd::testing::StatusIs;
using ::tierd::testing::Subprocess;
using ::tierd::testing::TempDir;

// ---- Socket access ------------------------------------------------------------------------------

TEST_F(OperationsTest, SocketsGetTheConfiguredGroupAndMode0660) {
  // The test's own group: the one group an unprivileged process can give its files.
  const gid_t gid = ::getgid();
  const struct group* group = ::getgrgid(gid);
  ASSERT_NE(group, nullptr);
  auto daemon = StartDaemon(TierdArgs({absl::StrCat("--socket-group=", group->gr_name)}));
  ASSERT_NE(daemon, nullptr);
  for (const std::string& path : {socket_path(), absl::StrCat(dir_.path(), "/gpu0.session.sock")}) {
    struct stat st;
    ASSERT_EQ(::stat(path.c_str(), &st), 0) << path;
    EXPECT_EQ(st.st_mode & 0777, 0660u) << path;
    EXPECT_EQ(st.st_gid, gid) << path;
  }
  // Nothing is left under the temporary name the socket starts with.
  EXPECT_NE(::access(absl::StrCat(socket_path(), ".starting").c_str(), F_OK), 0);
  daemon->Signal(SIGTERM);
  EXPECT_THAT(daemon->Wait(kTimeout), IsOkAndHolds(0));

  auto unknown = RunProgram(TierdArgs({"--socket-group=no-such-group-tierd"}), kTimeout);
  ASSERT_THAT(unknown, IsOk());
  EXPECT_EQ(unknown->exit_code, 2);
}

TEST_F(OperationsTest, ModelsAreRegisteredOnlyFromTheModelRoots) {
  const std::string root = absl::StrCat(dir_.path(), "/models");
  const std::string outside = absl::StrCat(dir_.path(), "/elsewhere");
  for (const std::string& model : {absl::StrCat(root, "/good"), outside}) {
    ASSERT_EQ(::system(absl::StrCat("mkdir -p ", model).c_str()), 0);
    ASSERT_THAT(testing::WriteSafetensors(absl::StrCat(model, "/model.safetensors"),
                                          {testing::RandomTensor("blocks.0.w", "F32", {4, 4}, 1)}),
                IsOk());
  }
  ASSERT_EQ(::symlink(outside.c_str(), absl::StrCat(root, "/escape").c_str()), 0);
  auto daemon = StartDaemon(TierdArgs({absl::StrCat("--model-roots=", root)}));
  ASSERT_NE(daemon, nullptr);
  auto good = Tierctl({"load", "good", absl::StrCat(root, "/good")});
  ASSERT_THAT(good, IsOk());
  EXPECT_EQ(good->exit_code, 0);
  for (const std::string& bad :
       {outside, absl::StrCat(root, "/escape"), absl::StrCat(root, "/../elsewhere")}) {
    auto refused = RunProgram({"/bin/sh", "-c",
                               absl::StrCat(SiblingBinary("tierctl"), " --socket=", socket_path(),
                                            " load bad ", bad, " 2>&1")},
                              kTimeout);
    ASSERT_THAT(refused, IsOk());
    EXPECT_EQ(refused->exit_code, 1) << bad;
    EXPECT_THAT(refused->output,
                ::testing::AnyOf(HasSubstr("PERMISSION_DENIED"), HasSubstr("INVALID_ARGUMENT")))
        << bad;
  }
  daemon->Signal(SIGTERM);
  EXPECT_THAT(daemon->Wait(kTimeout), IsOkAndHolds(0));
  auto bad_root = RunProgram(TierdArgs({"--model-roots=relative/models"}), kTimeout);
  ASSERT_THAT(bad_root, IsOk());
  EXPECT_EQ(bad_root->exit_code, 2);
}

TEST_F(OperationsTest, LoadWithVerifyChecksEvenAFirstRead) {
  const std::string model = absl::StrCat(dir_.path(), "/verified");
  ASSERT_EQ(::system(absl::StrCat("mkdir -p ", model).c_str()), 0);
  const std::string file = absl::StrCat(model, "/model.safetensors");
  ASSERT_THAT(
      testing::WriteSafetensors(file, {testing::RandomTensor("blocks.0.w", "F32", {64}, 1),
                                       testing::RandomTensor("blocks.1.w", "F32", {64}, 2)}),
      IsOk());
  auto daemon = StartDaemon(TierdArgs());
  ASSERT_NE(daemon, nullptr);
  auto load = RunProgram({"/bin/sh", "-c",
                          absl::StrCat(SiblingBinary("tierctl"), " --socket=", socket_path(),
                                       " load v ", model, " --verify 2>&1")},
                         kTimeout);
  ASSERT_THAT(load, IsOk());
  EXPECT_EQ(load->exit_code, 0) << load->output;
  EXPECT_THAT(load->output, HasSubstr("verified"));  // the progress, in bytes
  // The last byte changes on disk with the file's size and mtime kept: only a checksum can tell,
  // and with --verify there is one before the first read.
  struct stat before {};
  ASSERT_EQ(::stat(file.c_str(), &before), 0);
  {
    std::fstream bytes(file, std::ios::in | std::ios::out | std::ios::binary);
    bytes.seekp(-1, std::ios::end);
    bytes.put('\x7f');
  }
  const timespec times[2] = {{0, UTIME_OMIT}, before.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, file.c_str(), times, 0), 0);
  auto get = RunProgram({"/bin/sh", "-c",
                         absl::StrCat(SiblingBinary("tierctl"), " --socket=", socket_path(),
                                      " get v/blocks.1 -o ", dir_.path(), "/out 2>&1")},
                        kTimeout);
  ASSERT_THAT(get, IsOk());
  EXPECT_EQ(get->exit_code, 1);
  EXPECT_THAT(get->output, HasSubstr("DATA_LOSS"));
  auto intact = Tierctl({"get", "v/blocks.0", "-o", absl::StrCat(dir_.path(), "/out0")});
  ASSERT_THAT(intact, IsOk());
  EXPECT_EQ(intact->exit_code, 0);
  // --verify belongs to load only.
  auto misplaced = Tierctl({"ls", "--verify"});
  ASSERT_THAT(misplaced, IsOk());
  EXPECT_EQ(misplaced->exit_code, 2);
}

// ---- Crashes ------------------------------------------------------------------------------------

TEST_F(OperationsTest, ClientsSeeUnavailableWhenTheDaemonIsKilledAndReconnectOnceItIsBack) {
  const std::string model = absl::StrCat(dir_.path(), "/model");
  ASSERT_EQ(::mkdir(model.c_str(), 0755), 0);
  const testing::TensorSpec tensor = testing::RandomTensor("blocks.0.w", "F32", {256, 256}, 5);
  ASSERT_THAT(testing::WriteSafetensors(absl::StrCat(model, "/model.safetensors"), {tensor}),
              IsOk());
  const std::vector<std::string> args = TierdArgs({"--gpu-pool-bytes=16MiB"});
  auto daemon = StartDaemon(args);
  ASSERT_NE(daemon, nullptr);
  ClientOptions options;
  options.socket_path = socket_path();
  auto client = Client::Connect(options);
  ASSERT_THAT(client, IsOk());
  ASSERT_THAT((*client)->RegisterModel("m", model, v1::GROUPING_BLOCK), IsOk());

  // Load: a thread fetching and releasing until its session fails.
  auto session = (*client)->OpenSession();
  ASSERT_THAT(session, IsOk());
  absl::Status failure;
  std::atomic<int> fetches{0};
  std::thread load([&] {
    while (true) {
      absl::StatusOr<Lease> lease = (*session)->Fetch("m/blocks.0");
      if (!lease.ok()) {
        failure = lease.status();
        return;
      }
      ++fetches;
      lease->Release();
    }
  });
  // Killed mid-load: once fetches are answered (the first reads the file, which on a loaded
  // machine took longer than a fixed 300 ms once), and a little after.
  const absl::Time loading = absl::Now();
  while (fetches.load() == 0 && absl::Now() - loading < kTimeout) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  absl::SleepFor(absl::Milliseconds(100));
  daemon->Signal(SIGKILL);
  ASSERT_THAT(daemon->Wait(kTimeout), IsOk());
  load.join();
  EXPECT_GT(fetches, 0);
  EXPECT_THAT(failure, StatusIs(absl::StatusCode::kUnavailable)) << failure;
  EXPECT_THAT((*client)->ListModels(), StatusIs(absl::StatusCode::kUnavailable));

  // Back on the same socket and state directory after a while (the dead one's socket is stale).
  absl::SleepFor(absl::Seconds(2));
  daemon = StartDaemon(args);
  ASSERT_NE(daemon, nullptr);
  const absl::Time back = absl::Now();
  absl::StatusOr<std::vector<v1::ModelSummary>> models;
  do {
    models = (*client)->ListModels();
  } while (!models.ok() && absl::Now() - back < absl::Seconds(10));
  ASSERT_THAT(models, IsOk());
  // The same client reconnected within its backoff's bound (a second) plus slack.
  EXPECT_LT(absl::Now() - back, absl::Seconds(3));
  ASSERT_EQ(models->size(), 1u);
  EXPECT_EQ((*models)[0].name(), "m");  // still registered
  auto again = (*client)->OpenSession();
  ASSERT_THAT(again, IsOk());
  auto lease = (*again)->Fetch("m/blocks.0");
  ASSERT_THAT(lease, IsOk());
  ASSERT_EQ(lease->size(), tensor.data.size());
  // The session's stream waits for the copy; so does this thread, before it reads (host backend).
  ASSERT_THAT((*again)->device().SynchronizeStream((*again)->default_stream()), IsOk());
  EXPECT_EQ(std::memcmp(lease->data(), tensor.data.data(), tensor.data.size()), 0);
  lease->Release();
  daemon->Signal(SIGTERM);
  EXPECT_THAT(daemon->Wait(kTimeout), IsOkAndHolds(0));
  RecordProperty("daemons_killed", 1);  // for docs/RELIABILITY.md
}

// ---- SIGTERM ------------------------------------------------------------------------------------

TEST_F(OperationsTest, SigtermDrainsOpenSessionsThenAnswersUnavailableAndExitsZero) {
  auto daemon = StartDaemon(TierdArgs({"--shutdown-grace-ms=1500", "--gpu-pool-bytes=16MiB"}));
  ASSERT_NE(daemon, nullptr);
  const std::string file = WriteFile("payload.bin", std::string(1 << 20, 'y'));
  auto put = Tierctl({"put", "kv/a", file});
  ASSERT_THAT(put, IsOk());
  ASSERT_EQ(put->exit_code, 0);

  // Two sessions, one on each transport, each holding a lease when SIGTERM comes.
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<Lease> leases;
  for (const char* session_socket : {"default", ""}) {
    ClientOptions options;
    options.socket_path = socket_path();
    if (std::string(session_socket).empty()) options.session_socket_path = "";
    auto client = Client::Connect(options);
    ASSERT_THAT(client, IsOk());
    auto session = (*client)->OpenSession();
    ASSERT_THAT(session, IsOk());
    auto lease = (*session)->Fetch("kv/a");
    ASSERT_THAT(lease, IsOk());
    leases.push_back(*std::move(lease));
    sessions.push_back(*std::move(session));
    clients.push_back(*std::move(client));
  }
  EXPECT_STREQ(sessions[0]->transport(), "socket");
  EXPECT_STREQ(sessions[1]->transport(), "grpc");

  const absl::Time signalled = absl::Now();
  daemon->Signal(SIGTERM);
  // During the grace: health says NOT_SERVING, new sessions are refused, open ones still work.
  absl::Time deadline = absl::Now() + absl::Seconds(1);
  absl::StatusOr<std::string> health;
  do {
    health = CheckHealth(socket_path(), absl::Milliseconds(200));
  } while (health.ok() && *health == "SERVING" && absl::Now() < deadline);
  if (health.ok()) {
    EXPECT_EQ(*health, "NOT_SERVING");
  }
  EXPECT_THAT(clients[0]->OpenSession(), StatusIs(absl::StatusCode::kUnavailable));
  for (size_t i = 0; i < sessions.size(); ++i) {
    leases[i].Release();
    auto again = sessions[i]->Fetch("kv/a");
    EXPECT_THAT(again, IsOk()) << "session " << i << " during the grace";
    if (again.ok()) again->Release();
  }
  // After the grace the sessions are ended and the daemon exits 0, well within grace + 10 s.
  EXPECT_THAT(daemon->Wait(kTimeout), IsOkAndHolds(0));
  EXPECT_LT(absl::Now() - signalled, absl::Seconds(1.5 + 10));
  for (size_t i = 0; i < sessions.size(); ++i) {
    EXPECT_THAT(sessions[i]->Fetch("kv/a"), StatusIs(absl::StatusCode::kUnavailable))
        << "session " << i;
  }
  EXPECT_NE(::access(socket_path().c_str(), F_OK), 0) << "socket left behind";
}

}  // namespace
}  // namespace tierd
