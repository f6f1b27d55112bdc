// tierd and tierctl as separate processes on a real Unix socket.
#include <fcntl.h>
#include <google/protobuf/descriptor.pb.h>
#include <grp.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/version.h"
#include "gmock/gmock.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::tierd::testing::IsOk;
using ::tierd::testing::IsOkAndHolds;
using ::tierd::testing::RunProgram;
using ::tierd::testing::SiblingBinary;
using ::tierd::testing::Subprocess;
using ::tierd::testing::TempDir;

constexpr absl::Duration kTimeout = absl::Seconds(30);
// A program refusing its flags exits at once; one that does not is killed after this.
constexpr absl::Duration kUsageTimeout = absl::Seconds(10);
// The address space a daemon expected to refuse its flags gets, should it start after all.
constexpr uint64_t kAddressSpaceBound = testing::AddressSpaceForRefusal(4ull << 30);

class DaemonProcessTest : public ::testing::Test {
 protected:
  std::string socket_path() const { return absl::StrCat(dir_.path(), "/gpu0.sock"); }

  std::vector<std::string> TierdArgs(const std::string& socket) const {
    return {SiblingBinary("tierd"),
            "--device=host",
            absl::StrCat("--socket=", socket),
            absl::StrCat("--state-dir=", dir_.path(), "/state"),
            "--host-cache-bytes=64MiB",
            "--gpu-pool-bytes=32MiB"};
  }

  absl::StatusOr<testing::RunResult> Tierctl(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {SiblingBinary("tierctl"),
                                     absl::StrCat("--socket=", socket_path())};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunProgram(argv, kTimeout);
  }

  // Starts tierd and waits until `tierctl health` says SERVING.
  std::unique_ptr<Subprocess> StartDaemon() {
    auto daemon = Subprocess::Start(TierdArgs(socket_path()));
    EXPECT_THAT(daemon, IsOk());
    if (!daemon.ok()) return nullptr;
    const absl::Time deadline = absl::Now() + kTimeout;
    while (absl::Now() < deadline) {
      auto health = Tierctl({"health"});
      if (health.ok() && health->exit_code == 0) return *std::move(daemon);
      absl::SleepFor(absl::Milliseconds(50));
    }
    ADD_FAILURE() << "tierd did not become healthy";
    return nullptr;
  }

  TempDir dir_;
};

TEST_F(DaemonProcessTest, ServesHealthOnItsSocketAndStopsCleanlyOnSigterm) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  auto health = Tierctl({"health"});
  ASSERT_THAT(health, IsOk());
  EXPECT_EQ(health->exit_code, 0);
  EXPECT_EQ(health->output, "SERVING\n");
  // Only the owner and the socket's group may connect.
  struct stat st;
  ASSERT_EQ(::stat(socket_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  // The storage tiers are up: the catalog's and the spill directory exist under the state dir.
  EXPECT_EQ(::access(absl::StrCat(dir_.path(), "/state/catalog").c_str(), F_OK), 0);
  EXPECT_EQ(::access(absl::StrCat(dir_.path(), "/state/spill").c_str(), F_OK), 0);

  daemon->Signal(SIGTERM);
  EXPECT_THAT(daemon->Wait(kTimeout), IsOkAndHolds(0));
  EXPECT_NE(::access(socket_path().c_str(), F_OK), 0) << "socket left behind";
}

// One version, the project's, from every place that reports it: both programs' --version, and the
// daemon's stats (tierctl stats shows them; GetStats carries the field).
TEST_F(DaemonProcessTest, TheProgramsAndTheStatsReportTheProjectsVersion) {
  for (const char* program : {"tierd", "tierctl"}) {
    auto version = RunProgram({SiblingBinary(program), "--version"}, kTimeout);
    ASSERT_THAT(version, IsOk());
    EXPECT_EQ(version->exit_code, 0);
    EXPECT_EQ(version->output, absl::StrCat(program, " ", Version(), "\n"));
  }
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  auto stats = Tierctl({"stats"});
  ASSERT_THAT(stats, IsOk());
  EXPECT_THAT(stats->output, HasSubstr(absl::StrCat("\nversion: ", Version(), "\n")));
  // GetStats' field, as grpcurl would print it.
  auto json = Tierctl({"stats", "--json"});
  ASSERT_THAT(json, IsOk());
  EXPECT_THAT(json->output, HasSubstr(absl::StrCat("\"version\": \"", Version(), "\"")));
}

// What `grpcurl -plaintext -unix SOCKET list` and `describe grpc.health.v1.Health` do: server
// reflection over the socket, with no proto files on the client's side.
TEST_F(DaemonProcessTest, ReflectionListsAndDescribesTheServedServices) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  auto channel =
      grpc::CreateChannel(absl::StrCat("unix:", socket_path()), grpc::InsecureChannelCredentials());
  auto stub = grpc::reflection::v1alpha::ServerReflection::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub->ServerReflectionInfo(&context);
  grpc::reflection::v1alpha::ServerReflectionRequest request;
  grpc::reflection::v1alpha::ServerReflectionResponse response;

  request.set_list_services("");
  ASSERT_TRUE(stream->Write(request));
  ASSERT_TRUE(stream->Read(&response));
  std::vector<std::string> services;
  for (const auto& service : response.list_services_response().service()) {
    services.push_back(service.name());
  }
  EXPECT_THAT(services, ::testing::IsSupersetOf({"grpc.health.v1.Health",
                                                 "grpc.reflection.v1alpha.ServerReflection",
                                                 "tierd.v1.Tierd"}));

  request.set_file_containing_symbol("grpc.health.v1.Health");
  ASSERT_TRUE(stream->Write(request));
  ASSERT_TRUE(stream->Read(&response));
  ASSERT_EQ(response.file_descriptor_response().file_descriptor_proto_size(), 1);
  google::protobuf::FileDescriptorProto file;
  ASSERT_TRUE(file.ParseFromString(response.file_descriptor_response().file_descriptor_proto(0)));
  EXPECT_EQ(file.package(), "grpc.health.v1");
  ASSERT_GE(file.service_size(), 1);
  EXPECT_EQ(file.service(0).name(), "Health");

  // What `grpcurl ... describe tierd.v1.Tierd` and a call by method name need.
  request.set_file_containing_symbol("tierd.v1.Tierd");
  ASSERT_TRUE(stream->Write(request));
  ASSERT_TRUE(stream->Read(&response));
  // The answer may carry other files too; find the one defining the service.
  bool found = false;
  for (const std::string& bytes : response.file_descriptor_response().file_descriptor_proto()) {
    ASSERT_TRUE(file.ParseFromString(bytes));
    if (file.package() == "tierd.v1") {
      found = true;
      break;
    }
  }
  ASSERT_TRUE(found);
  ASSERT_EQ(file.service_size(), 1);
  std::vector<std::string> methods;
  for (const auto& method : file.service(0).method()) methods.push_back(method.name());
  EXPECT_THAT(methods, ::testing::IsSupersetOf({"Session", "RegisterModel", "ListObjects",
                                                "Prefetch", "Evict", "GetStats", "ListHandles"}));

  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(DaemonProcessTest, SigintStopsItToo) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  daemon->Signal(SIGINT);
  EXPECT_THAT(daemon->Wait(kTimeout), IsOkAndHolds(0));
}

TEST_F(DaemonProcessTest, HealthWithoutADaemonFailsWithUnavailable) {
  auto health = Tierctl({"health"});
  ASSERT_THAT(health, IsOk());
  EXPECT_EQ(health->exit_code, 1);
  // tierctl prints the status on stderr; stdout stays empty.
  EXPECT_EQ(health->output, "");
}

// get and put open a session; with no daemon their error names the socket, as every other
// command's does, rather than only saying that the session ended.
TEST_F(DaemonProcessTest, GetAndPutWithoutADaemonNameTheSocket) {
  const std::string file = absl::StrCat(dir_.path(), "/payload");
  { std::ofstream(file) << "bytes"; }
  const std::vector<std::vector<std::string>> commands = {
      {"get", "kv/k", "-o", absl::StrCat(dir_.path(), "/out")},
      {"put", "kv/k", file},
      {"ls"},
  };
  for (const std::vector<std::string>& command : commands) {
    std::vector<std::string> argv = {SiblingBinary("tierctl"),
                                     absl::StrCat("--socket=", socket_path())};
    argv.insert(argv.end(), command.begin(), command.end());
    auto result = testing::RunProgramWithStderr(argv, kTimeout);
    ASSERT_THAT(result, IsOk());
    EXPECT_EQ(result->exit_code, 1) << command[0];
    EXPECT_THAT(result->output, HasSubstr("UNAVAILABLE: ")) << command[0];
    EXPECT_THAT(result->output, HasSubstr(socket_path())) << command[0] << ": " << result->output;
  }
}

// `get -o PATH` writes a regular file through a temporary renamed over it, but writes into a
// device or a FIFO in place: renamed over, /dev/null would become a regular file for the whole
// machine. A file of the user's called PATH.tmp is not touched either.
TEST_F(DaemonProcessTest, GetWritesIntoADeviceOrAFifoWithoutReplacingIt) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const std::string payload = absl::StrCat(dir_.path(), "/payload");
  { std::ofstream(payload) << "twelve bytes"; }
  ASSERT_EQ(Tierctl({"put", "kv/k", payload})->exit_code, 0);
  auto contents = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  auto files_named = [&](const std::string& prefix) {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir_.path())) {
      const std::string name = entry.path().filename();
      if (absl::StartsWith(name, prefix)) names.push_back(name);
    }
    return names;
  };

  // A character device, as /dev/null is (mknod needs CAP_MKNOD; the FIFO below needs nothing).
  const std::string device = absl::StrCat(dir_.path(), "/null");
  if (::mknod(device.c_str(), S_IFCHR | 0666, ::makedev(1, 3)) == 0) {
    auto got = Tierctl({"get", "kv/k", "-o", device});
    ASSERT_THAT(got, IsOk());
    EXPECT_EQ(got->exit_code, 0) << got->output;
    struct stat st {};
    ASSERT_EQ(::stat(device.c_str(), &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode)) << "the device node was replaced";
    EXPECT_EQ(st.st_rdev, ::makedev(1, 3));
    EXPECT_THAT(files_named("null"), ::testing::ElementsAre("null"));
  } else {
    std::cerr << "mknod: " << std::strerror(errno) << "; only the FIFO is checked\n";
  }

  // Its read end is opened here first (without blocking), so that tierctl's open for writing
  // finds a reader and the bytes wait in the pipe.
  const std::string fifo = absl::StrCat(dir_.path(), "/fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int read_end = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(read_end, 0);
  auto got = Tierctl({"get", "kv/k", "-o", fifo});
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->exit_code, 0) << got->output;
  char read_back[64] = {};
  const ssize_t read = ::read(read_end, read_back, sizeof(read_back));
  ::close(read_end);
  EXPECT_EQ(std::string(read_back, std::max<ssize_t>(read, 0)), "twelve bytes");
  struct stat st {};
  ASSERT_EQ(::stat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the FIFO was replaced";
  EXPECT_THAT(files_named("fifo"), ::testing::ElementsAre("fifo"));

  // A regular file: replaced whole, and a file that merely has the temporary's old name stays.
  const std::string out = absl::StrCat(dir_.path(), "/out");
  { std::ofstream(out + ".tmp") << "mine"; }
  { std::ofstream(out) << "old contents, longer than the object"; }
  got = Tierctl({"get", "kv/k", "-o", out});
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->exit_code, 0) << got->output;
  EXPECT_EQ(contents(out), "twelve bytes");
  EXPECT_EQ(contents(out + ".tmp"), "mine");
  EXPECT_THAT(files_named("out"), ::testing::UnorderedElementsAre("out", "out.tmp"));

  // A directory is refused, naming it.
  got = Tierctl({"get", "kv/k", "-o", dir_.path()});
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->exit_code, 1);
}

// A daemon of a node (its host arena in /dev/shm) killed with SIGKILL leaves its arena there. Its
// restart, in a /dev/shm that cannot hold two arenas, must remove the dead one before it measures
// the free space: it once measured first and exited 2, which systemd never retries. Run in a
// mount namespace of its own with a 64 MiB /dev/shm (root only).
TEST_F(DaemonProcessTest, ADaemonKilledWithItsArenaInDevShmStartsAgainWhereOnlyOneFits) {
  const std::string script = R"(
set -u
dir=$1 tierd=$2 tierctl=$3
mount -t tmpfs -o size=64m tmpfs /dev/shm || exit 77
start() {
  "$tierd" --device=host --socket="$dir/gpu0.sock" --state-dir="$dir/state" \
    --host-cache-bytes=40MiB --gpu-pool-bytes=4MiB --gpu-slab-bytes=4MiB \
    --peer-host-buffer-bytes=4MiB --peers="$dir/gpu0.sock,$dir/gpu1.sock" 2>>"$dir/log" &
  pid=$!
  for _ in $(seq 300); do
    "$tierctl" --socket="$dir/gpu0.sock" --timeout-ms=1000 health >/dev/null 2>&1 && return 0
    if ! kill -0 $pid 2>/dev/null; then wait $pid; echo "exited with status $?"; return 1; fi
    sleep 0.1
  done
  echo "not serving"
  return 1
}
start && echo "first serving"
kill -9 $pid
wait $pid 2>/dev/null
start && echo "second serving"
kill -TERM $pid 2>/dev/null
wait $pid 2>/dev/null
)";
  auto run = RunProgram({"/usr/bin/unshare", "-m", "/bin/sh", "-c", script, "sh", dir_.path(),
                         SiblingBinary("tierd"), SiblingBinary("tierctl")},
                        kTimeout);
  ASSERT_THAT(run, IsOk());
  if (run->exit_code == 77 || !absl::StrContains(run->output, "first serving")) {
    GTEST_SKIP() << "needs a mount namespace of its own (root): " << run->output;
  }
  EXPECT_THAT(run->output, HasSubstr("second serving"));
}

TEST_F(DaemonProcessTest, SecondDaemonOnTheSameSocketIsRefused) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  auto second = RunProgram(TierdArgs(socket_path()), kTimeout);
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ(second->exit_code, 1);
  // The first one is unharmed.
  auto health = Tierctl({"health"});
  ASSERT_THAT(health, IsOk());
  EXPECT_EQ(health->exit_code, 0);
}

TEST_F(DaemonProcessTest, SecondDaemonOnTheSameStateDirIsRefused) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  auto second = RunProgram(TierdArgs(absl::StrCat(dir_.path(), "/other.sock")), kTimeout);
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ(second->exit_code, 1);
}

TEST_F(DaemonProcessTest, StaleSocketOfADeadDaemonIsReplaced) {
  // A socket file nobody listens on, as a SIGKILLed daemon leaves behind.
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un address = {};
  address.sun_family = AF_UNIX;
  std::snprintf(address.sun_path, sizeof(address.sun_path), "%s", socket_path().c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<struct sockaddr*>(&address), sizeof(address)), 0);
  ::close(fd);
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
}

TEST_F(DaemonProcessTest, RegularFileAtTheSocketPathIsNeverDeleted) {
  { std::ofstream(socket_path()) << "precious"; }
  auto result = RunProgram(TierdArgs(socket_path()), kTimeout);
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->exit_code, 1);
  std::ifstream in(socket_path());
  std::string content;
  in >> content;
  EXPECT_EQ(content, "precious");
}

TEST_F(DaemonProcessTest, BadFlagsExitWithUsageError) {
  std::vector<std::string> bad_device = TierdArgs(socket_path());
  bad_device[1] = "--device=tpu:0";
  auto result = RunProgram(bad_device, kTimeout);
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->exit_code, 2);

  std::vector<std::string> zero_budget = TierdArgs(socket_path());
  zero_budget[4] = "--host-cache-bytes=0";
  result = RunProgram(zero_budget, kTimeout);
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->exit_code, 2);

  for (const char* flag : {"--host-cache-policy=mru", "--io-engine=aio",
                           "--reader-chunk-bytes=1000", "--reader-threads=0"}) {
    std::vector<std::string> args = TierdArgs(socket_path());
    args.push_back(flag);
    result = RunProgram(args, kTimeout);
    ASSERT_THAT(result, IsOk());
    EXPECT_EQ(result->exit_code, 2) << flag;
  }

  auto unknown_command = Tierctl({"frobnicate"});
  ASSERT_THAT(unknown_command, IsOk());
  EXPECT_EQ(unknown_command->exit_code, 2);
}

// Bad usage exits 2, which docs/CONFIGURATION.md promises and the systemd unit relies on
// (RestartPreventExitStatus=2), with a message naming the flag and its value; absl's own parser
// would exit 1.
TEST_F(DaemonProcessTest, UsageErrorsExitWithStatus2NamingTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> tierd_cases = {
      {{"--unknown-flag=1"}, "unknown flag --unknown-flag"},
      {{"--host-cache-bytes=abc"}, "--host-cache-bytes=abc: "},
      {{"--host-cache-bytes=-1"}, "--host-cache-bytes=-1: "},
      {{"--host-cache-bytes=99999999999TiB"}, "--host-cache-bytes=99999999999TiB: "},
      {{"--max-sessions=-1"}, "--max-sessions=-1: "},
      {{"--v=abc"}, "--v=abc: "},
      {{"--direct-io=maybe"}, "--direct-io=maybe: "},
      {{"--shutdown-grace-ms=-5"}, "--shutdown-grace-ms=-5 "},
      {{"--v=1", "--v", "2"}, "--v is given twice"},
      {{"--gpu_pool_bytes=8MiB"}, "--gpu_pool_bytes is given twice (also as --gpu-pool-bytes)"},
      {{"--flagfile=/dev/null"}, "--flagfile is not one of this program's flags"},
      {{"--nodirect-io=true"}, "--nodirect-io takes no value"},
      {{"--state-dir"}, "--state-dir needs a value"},
      {{"--remote-cache-dir=/tmp/x"}, "--remote-cache-dir caches models from --s3-endpoint"},
      {{"--remote-host-streams=-1"}, "--remote-host-streams must be 0 to 65536"},
      {{"--s3-ca-file=/no/such/ca.pem"}, "--s3-ca-file /no/such/ca.pem cannot be read"},
  };
  for (const Case& bad : tierd_cases) {
    std::vector<std::string> argv = {
        SiblingBinary("tierd"), "--device=host", absl::StrCat("--socket=", socket_path()),
        absl::StrCat("--state-dir=", dir_.path(), "/state"), "--gpu-pool-bytes=8MiB"};
    argv.insert(argv.end(), bad.args.begin(), bad.args.end());
    // A usage error is found before anything starts: well within the bound.
    auto result = testing::RunProgramWithStderr(argv, kUsageTimeout, kAddressSpaceBound);
    ASSERT_THAT(result, IsOk()) << bad.args[0];
    EXPECT_EQ(result->exit_code, 2) << bad.args[0] << ": " << result->output;
    EXPECT_THAT(result->output, HasSubstr(absl::StrCat("tierd: ", bad.message))) << bad.args[0];
  }

  const std::vector<Case> tierctl_cases = {
      {{"--bogus", "health"}, "unknown flag --bogus"},
      {{"get", "kv/k", "-o"}, "-o needs a value"},
      {{"get", "kv/k", "-o", "--json"}, "-o needs a value"},
      {{"--timeout-ms=abc", "health"}, "--timeout-ms=abc: "},
      {{"--timeout-ms=0", "health"}, "--timeout-ms=0 "},
      {{"--timeout-ms", "-20", "health"}, "--timeout-ms=-20 "},
      {{"--json", "--json", "stats"}, "--json is given twice"},
  };
  for (const Case& bad : tierctl_cases) {
    std::vector<std::string> argv = {SiblingBinary("tierctl"),
                                     absl::StrCat("--socket=", socket_path())};
    argv.insert(argv.end(), bad.args.begin(), bad.args.end());
    auto result = testing::RunProgramWithStderr(argv, kUsageTimeout, kAddressSpaceBound);
    ASSERT_THAT(result, IsOk()) << bad.args[0];
    EXPECT_EQ(result->exit_code, 2) << absl::StrJoin(bad.args, " ") << ": " << result->output;
    EXPECT_THAT(result->output, HasSubstr(absl::StrCat("tierctl: ", bad.message)))
        << absl::StrJoin(bad.args, " ");
  }
}

// Sizes and counts a machine cannot hold are refused with status 2 before anything is allocated:
// --reader-threads=100000 once grew a daemon to 22 GB, and a client group's pool larger than
// /dev/shm filled it. Each run is bounded (ulimit -v) should it start allocating after all.
TEST_F(DaemonProcessTest, FlagsTheMachineCannotHoldAreRefusedBeforeAnythingIsAllocated) {
  const struct group* own_group = ::getgrgid(::getgid());
  ASSERT_NE(own_group, nullptr);
  // Far beyond any machine's memory, and beyond /dev/shm's size, which the kernel checks before
  // allocating a shared memory object of the host backend's single slab.
  const std::string beyond = "16384TiB";
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--reader-threads=100000"}, "--reader-threads=100000 is more than 4 x "},
      {{"--reader-threads=0"}, "--reader-threads must be auto or a number from 1, not '0'"},
      {{"--reader-threads=many"}, "--reader-threads must be auto or a number from 1, not 'many'"},
      {{absl::StrCat("--host-cache-bytes=", beyond)},
       "--host-cache-bytes=16384 TiB is more than the memory available"},
      {{absl::StrCat("--gpu-pool-bytes=", beyond), absl::StrCat("--gpu-slab-bytes=", beyond)},
       "--gpu-pool-bytes=16384 TiB is more than the free space of /dev/shm"},
      {{absl::StrCat("--client-groups=big:", own_group->gr_name, ":", beyond),
        absl::StrCat("--gpu-slab-bytes=", beyond)},
       "--client-groups big:16384 TiB is more than the free space of /dev/shm"},
  };
  for (const Case& bad : cases) {
    std::vector<std::string> argv = {SiblingBinary("tierd"), "--device=host",
                                     absl::StrCat("--socket=", socket_path()),
                                     absl::StrCat("--state-dir=", dir_.path(), "/state")};
    const std::vector<std::string> budgets = {"--host-cache-bytes=64MiB", "--gpu-pool-bytes=8MiB"};
    for (const std::string& budget : budgets) {
      const std::string name = budget.substr(0, budget.find('='));
      if (std::none_of(bad.args.begin(), bad.args.end(),
                       [&](const std::string& arg) { return absl::StartsWith(arg, name); })) {
        argv.push_back(budget);
      }
    }
    argv.insert(argv.end(), bad.args.begin(), bad.args.end());
    const absl::Time start = absl::Now();
    auto result = testing::RunProgramWithStderr(argv, kUsageTimeout, kAddressSpaceBound);
    ASSERT_THAT(result, IsOk()) << bad.args[0];
    EXPECT_EQ(result->exit_code, 2) << bad.args[0] << ": " << result->output;
    EXPECT_THAT(result->output, HasSubstr(bad.message)) << bad.args[0];
    EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << bad.args[0];
    // Nothing is left behind: no socket, no shared memory of the host backend's slabs.
    EXPECT_NE(::access(socket_path().c_str(), F_OK), 0) << bad.args[0];
  }
}

// What the parser keeps from absl's: a value in the next argument, underscores, --noboolflag,
// "--" ending the flags, and tierctl's -o FILE.
TEST_F(DaemonProcessTest, FlagSpellingsAbslAcceptedStillWork) {
  auto daemon = Subprocess::Start({SiblingBinary("tierd"), "--device", "host", "--socket",
                                   socket_path(), absl::StrCat("--state_dir=", dir_.path(), "/s"),
                                   "--host-cache-bytes", "64MiB", "--gpu_pool_bytes=32MiB",
                                   "--nodirect-io", "--shutdown-grace-ms", "0"});
  ASSERT_THAT(daemon, IsOk());
  absl::StatusOr<testing::RunResult> health;
  const absl::Time deadline = absl::Now() + kTimeout;
  do {
    absl::SleepFor(absl::Milliseconds(50));
    health = Tierctl({"--timeout-ms", "1000", "health"});
  } while (absl::Now() < deadline && (!health.ok() || health->exit_code != 0));
  ASSERT_THAT(health, IsOk());
  EXPECT_EQ(health->output, "SERVING\n");
  const std::string payload = absl::StrCat(dir_.path(), "/payload");
  { std::ofstream(payload) << "twelve bytes"; }
  auto put = Tierctl({"put", "kv/k", payload});
  ASSERT_THAT(put, IsOk());
  EXPECT_EQ(put->exit_code, 0);
  auto get = Tierctl({"get", "-o", "-", "--", "kv/k"});
  ASSERT_THAT(get, IsOk());
  EXPECT_EQ(get->exit_code, 0);
  EXPECT_EQ(get->output, "twelve bytes");
  (*daemon)->Signal(SIGTERM);
  EXPECT_THAT((*daemon)->Wait(kTimeout), IsOkAndHolds(0));
}

}  // namespace
}  // namespace tierd
