// Bounds on sessions whose clients misbehave, on daemon processes: a session-socket frame begun
// must be finished within SessionSocketServer::kFrameTimeout, while a connection idle between
// frames may stay; answers clients do not read are bounded across the daemon
// (--max-unread-answer-bytes), on the session socket and the gRPC Session stream; a session whose
// thread the system will not start is refused, the daemon going on.
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/tierd_client.h"
#include "common/sanitizers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/session_socket_server.h"
#include "tests/daemon_test_support.h"
#include "tests/test_support.h"
#include "tierd/v1/tierd.pb.h"
#include "wire/session_socket.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::tierd::testing::ConnectUnix;
using ::tierd::testing::IsOk;
using ::tierd::testing::IsOkAndHolds;
using ::tierd::testing::SiblingBinary;
using ::tierd::testing::StatusIs;
using ::tierd::testing::Subprocess;
using ::tierd::testing::TempDir;

constexpr absl::Duration kTimeout = absl::Seconds(30);
#if TIERD_UNDER_ASAN
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
// 1000 bytes that are no key (no '/'): each fetch of it is answered INVALID_ARGUMENT quoting its
// first 256 bytes, so each answer is about 300 bytes.
const std::string kLongMalformedKey(1000, 'x');

// `count` fetches of kLongMalformedKey, framed, ids from `first_id`.
std::string MalformedFetches(int count, uint64_t first_id) {
  std::string frames;
  for (int i = 0; i < count; ++i)
    frames += EncodeFrame(testing::FetchRequestFor(first_id + i, kLongMalformedKey));
  return frames;
}

// Whether the daemon has shut `fd`'s connection down in both directions (as it does to cut it),
// whatever the client left unread.
bool HungUpByDaemon(int fd) {
  pollfd hang_up{fd, 0, 0};
  return ::poll(&hang_up, 1, 0) > 0 && (hang_up.revents & POLLHUP) != 0;
}

// Whether the daemon has closed `fd`'s connection: an end of stream (or a reset) is waiting.
bool ClosedByDaemon(int fd) {
  pollfd ready{fd, POLLIN, 0};
  if (::poll(&ready, 1, 0) <= 0) return false;
  char byte;
  return ::recv(fd, &byte, 1, MSG_DONTWAIT | MSG_PEEK) <= 0;
}

class SessionSocketLimitsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (int fd : fds_) ::close(fd);
    if (daemon_ != nullptr) {
      daemon_->Signal(SIGTERM);
      EXPECT_THAT(daemon_->Wait(kTimeout), IsOkAndHolds(0));
    }
    if (HasFailure()) std::fprintf(stderr, "tierd's log:\n%s", Log().c_str());
  }

  // Starts tierd with `flags` besides the usual ones, its log going to log_path(); run by `runner`
  // (e.g. setpriv and its flags) when it is not empty.
  void StartDaemon(const std::vector<std::string>& flags = {},
                   const std::vector<std::string>& runner = {}) {
    std::vector<std::string> argv = {"/bin/sh", "-c",
                                     absl::StrCat("exec \"$0\" \"$@\" 2>", log_path())};
    argv.insert(argv.end(), runner.begin(), runner.end());
    argv.insert(argv.end(),
                {SiblingBinary("tierd"), "--device=host", absl::StrCat("--socket=", socket_path()),
                 absl::StrCat("--state-dir=", dir_.path(), "/state"), "--host-cache-bytes=16MiB",
                 "--gpu-pool-bytes=2MiB", "--gpu-slab-bytes=1MiB", "--shutdown-grace-ms=1000"});
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto daemon = testing::StartServingDaemon(argv, socket_path(), kTimeout);
    ASSERT_THAT(daemon, IsOk());
    daemon_ = *std::move(daemon);
  }

  std::string socket_path() const { return absl::StrCat(dir_.path(), "/gpu0.sock"); }
  std::string session_socket_path() const { return SessionSocketPathFor(socket_path()); }
  std::string log_path() const { return absl::StrCat(dir_.path(), "/tierd.log"); }
  std::string Log() const {
    std::ifstream in(log_path());
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  // A connection to the session socket that has greeted and opened a session; closed by TearDown.
  int OpenSession() {
    const int fd =
        testing::OpenSessionSocketSession(session_socket_path(), "session_socket_limits_test");
    fds_.push_back(fd);
    return fd;
  }

  TempDir dir_;
  std::unique_ptr<Subprocess> daemon_;
  std::vector<int> fds_;
};

TEST_F(SessionSocketLimitsTest, AFrameLeftUnfinishedIsClosedAfterTheFrameTimeoutButAnIdleOneIsNot) {
  StartDaemon();
  const std::string frame = EncodeFrame(testing::PrefetchRequestFor(2, "m/nothing"));
  ASSERT_GT(frame.size(), 8u);
  // Two bytes of a frame's length; a whole length and part of the payload; a whole frame, then
  // nothing (idle between frames).
  const int in_header = OpenSession();
  const int in_payload = OpenSession();
  const int idle = OpenSession();
  const absl::Time start = absl::Now();
  ASSERT_THAT(SendAll(in_header, frame.substr(0, 2)), IsOk());
  ASSERT_THAT(SendAll(in_payload, frame.substr(0, 6)), IsOk());
  ASSERT_THAT(SendAll(idle, frame), IsOk());
  std::string payload;
  ASSERT_THAT(ReadFrame(idle, payload), IsOk());

  const absl::Duration timeout = SessionSocketServer::kFrameTimeout;
  absl::SleepFor(timeout / 2);
  EXPECT_FALSE(ClosedByDaemon(in_header)) << "closed before the frame timeout";
  EXPECT_FALSE(ClosedByDaemon(in_payload)) << "closed before the frame timeout";
  while (absl::Now() - start < timeout + absl::Seconds(5) &&
         !(ClosedByDaemon(in_header) && ClosedByDaemon(in_payload))) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(ClosedByDaemon(in_header)) << "a frame stalled in its length was not cut off";
  EXPECT_TRUE(ClosedByDaemon(in_payload)) << "a frame stalled in its payload was not cut off";
  EXPECT_GE(absl::Now() - start, timeout);
  EXPECT_THAT(Log(), HasSubstr("incomplete"));

  // The idle connection, as long past its last frame, is still served.
  EXPECT_FALSE(ClosedByDaemon(idle));
  ASSERT_THAT(SendAll(idle, EncodeFrame(testing::PrefetchRequestFor(3, "m/nothing"))), IsOk());
  ASSERT_THAT(ReadFrame(idle, payload), IsOk());
  v1::SessionResponse answer;
  ASSERT_TRUE(answer.ParseFromString(payload));
  EXPECT_EQ(answer.request_id(), 3u);
}

// The frame timeout is the client's, not the daemon's: a client whose frame arrived in time, while
// the daemon was held up (here stopped, for longer than the timeout), is answered when the daemon
// goes on, not cut because its deadline passed before the daemon read what was already there.
TEST_F(SessionSocketLimitsTest, AFrameThatArrivedInTimeIsReadThoughTheDaemonWasHeldUp) {
  StartDaemon();
  const int fd = OpenSession();
  const std::string frame = EncodeFrame(testing::PrefetchRequestFor(2, "m/nothing"));
  ASSERT_THAT(SendAll(fd, frame.substr(0, 6)), IsOk());  // the frame has begun
  absl::SleepFor(absl::Milliseconds(100));               // and the daemon has seen it begin
  ASSERT_THAT(daemon_->Stop(kTimeout), IsOk());
  ASSERT_THAT(SendAll(fd, frame.substr(6)), IsOk());  // the rest, in time, into the socket
  absl::SleepFor(SessionSocketServer::kFrameTimeout + absl::Seconds(1));
  daemon_->Signal(SIGCONT);
  std::string payload;
  ASSERT_THAT(ReadFrame(fd, payload), IsOk()) << "cut although its bytes had arrived in time";
  v1::SessionResponse answer;
  ASSERT_TRUE(answer.ParseFromString(payload));
  EXPECT_EQ(answer.request_id(), 2u);
  EXPECT_FALSE(ClosedByDaemon(fd));
}

TEST_F(SessionSocketLimitsTest, OneThreadServesEverySessionWhileOthersStallOrDoNotRead) {
  StartDaemon({"--session-threads=1"});
  EXPECT_THAT(Log(), HasSubstr("with 1 thread(s)"));
  // On the one thread: a connection that sent half its greeting, one that sent half a frame, and
  // one that sends requests and does not read the answers, which are more than its socket holds.
  const int half_greeting = ConnectUnix(session_socket_path());
  fds_.push_back(half_greeting);
  const absl::Time start = absl::Now();
  ASSERT_THAT(SendAll(half_greeting, SessionSocketHello().substr(0, 3)), IsOk());
  const int in_frame = OpenSession();
  ASSERT_THAT(SendAll(in_frame, EncodeFrame(testing::PrefetchRequestFor(2, "m/x")).substr(0, 6)),
              IsOk());
  constexpr int kUnread = 2000;  // about 600 KB of answers
  const int not_reading = OpenSession();
  ASSERT_THAT(SendAll(not_reading, MalformedFetches(kUnread, 10)), IsOk());

  // Meanwhile sessions side by side are answered, each in order.
  constexpr int kSessions = 4;
  constexpr int kCalls = 50;
  std::vector<int> sessions;
  for (int i = 0; i < kSessions; ++i) sessions.push_back(OpenSession());
  std::vector<std::thread> callers;
  for (const int fd : sessions) {
    callers.emplace_back([fd] {
      for (int call = 0; call < kCalls; ++call) {
        const uint64_t id = 100 + call;
        ASSERT_THAT(SendAll(fd, EncodeFrame(testing::PrefetchRequestFor(id, "m/nothing"))), IsOk());
        std::string payload;
        ASSERT_THAT(ReadFrame(fd, payload), IsOk());
        v1::SessionResponse answer;
        ASSERT_TRUE(answer.ParseFromString(payload));
        EXPECT_EQ(answer.request_id(), id);
      }
    });
  }
  for (std::thread& caller : callers) caller.join();
  EXPECT_LT(absl::Now() - start, SessionSocketServer::kGreetingTimeout)
      << "the sessions waited for the stalled connections";
  EXPECT_FALSE(ClosedByDaemon(half_greeting)) << "closed before the greeting timeout";

  // The client that did not read gets every answer, in order, once it reads.
  for (int i = 0; i < kUnread; ++i) {
    std::string payload;
    ASSERT_THAT(ReadFrame(not_reading, payload), IsOk());
    v1::SessionResponse answer;
    ASSERT_TRUE(answer.ParseFromString(payload));
    ASSERT_EQ(answer.request_id(), 10u + i);
    EXPECT_EQ(answer.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  }
  // The stalled ones are closed once their time is up.
  while (absl::Now() - start < SessionSocketServer::kFrameTimeout + absl::Seconds(10) &&
         !(ClosedByDaemon(half_greeting) && ClosedByDaemon(in_frame))) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(ClosedByDaemon(half_greeting)) << "a greeting left unfinished was not cut off";
  EXPECT_TRUE(ClosedByDaemon(in_frame)) << "a frame left unfinished was not cut off";
  EXPECT_GE(absl::Now() - start, SessionSocketServer::kGreetingTimeout);
}

TEST_F(SessionSocketLimitsTest, ClientsThatDoNotReadAreCutOnceTheirAnswersPassTheDaemonsBudget) {
  // 1 MiB for every session together, so also 1 MiB for one.
  StartDaemon({"--max-unread-answer-bytes=1MiB"});
  const int64_t resident_before = testing::ResidentKiB(daemon_->pid());
  ASSERT_GT(resident_before, 0);
  // Clients that send fetches and never read the answers: about 600 KiB of answers each (an
  // answer quotes 256 bytes of the key: about 300 bytes), under the 1 MiB one session may queue,
  // and some of it in the socket's own buffers. Together they pass the budget.
  constexpr int kNonReaders = 6;
  constexpr int kFetchesEach = 2000;
  std::vector<int> non_readers;
  for (int i = 0; i < kNonReaders; ++i) {
    const int fd = OpenSession();
    non_readers.push_back(fd);
    // A cut connection refuses the rest of what is sent: that is fine.
    (void)SendAll(fd, MalformedFetches(kFetchesEach, 2));
  }
  // A client that reads its answers as they come (ten at a time, which the socket's own buffer
  // holds) is served in full meanwhile.
  const int reader = OpenSession();
  std::string payload;
  for (int batch = 0; batch < kFetchesEach / 10; ++batch) {
    ASSERT_THAT(SendAll(reader, MalformedFetches(10, 2 + 10 * batch)), IsOk());
    for (int i = 0; i < 10; ++i) {
      ASSERT_THAT(ReadFrame(reader, payload), IsOk()) << batch;
      v1::SessionResponse answer;
      ASSERT_TRUE(answer.ParseFromString(payload));
      ASSERT_EQ(answer.code(), static_cast<int>(absl::StatusCode::kInvalidArgument))
          << answer.message();
      ASSERT_GT(payload.size(), 280u);  // the answers are as large as this test counts on
    }
  }

  int cut = 0;
  const absl::Time deadline = absl::Now() + kTimeout;
  do {
    cut = 0;
    for (int fd : non_readers) cut += HungUpByDaemon(fd) ? 1 : 0;
  } while (cut == 0 && absl::Now() < deadline && (absl::SleepFor(absl::Milliseconds(20)), true));
  EXPECT_GE(cut, 1) << "no client that does not read was cut";
  EXPECT_LT(cut, kNonReaders) << "every one was cut: their sum, not each, should pass the budget";
  EXPECT_THAT(Log(), HasSubstr("past --max-unread-answer-bytes (1 MiB)"));
  const int64_t resident_after = testing::ResidentKiB(daemon_->pid());
  // ASan keeps freed memory in quarantine: its RSS says nothing here.
  if (!kAddressSanitizer) {
    EXPECT_LT(resident_after - resident_before, 64 << 10)
        << "KiB resident before: " << resident_before << ", after: " << resident_after;
  }

  // Once the clients are gone their share is free again: a new client may queue as much.
  for (int fd : non_readers) {
    ::close(fd);
    fds_.erase(std::find(fds_.begin(), fds_.end(), fd));
  }
  absl::SleepFor(absl::Milliseconds(200));
  const int another = OpenSession();
  ASSERT_THAT(SendAll(another, MalformedFetches(kFetchesEach, 2)), IsOk());
  EXPECT_FALSE(HungUpByDaemon(reader));
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(HungUpByDaemon(another)) << "the budget was not given back";
  for (int i = 0; i < kFetchesEach; ++i) ASSERT_THAT(ReadFrame(another, payload), IsOk()) << i;
}

// One client hoards unread answers; a client of another group, which reads its answers in the end,
// needs a little room meanwhile: the hoarder is cut, the other is served in full. (The budget once
// cut whichever connection happened to charge past it: a client holding 64 MiB was never cut, and
// another group's client was, with 144 KiB queued.)
TEST_F(SessionSocketLimitsTest, TheClientHoldingTheMostUnreadAnswersIsCutNotAnotherGroups) {
  const struct group* group = ::getgrgid(::getgid());
  ASSERT_NE(group, nullptr);
  StartDaemon({"--max-unread-answer-bytes=1MiB",
               absl::StrCat("--client-groups=tenant:", group->gr_name, ":2MiB")});
  // About 900 KiB of answers, most of them queued in the daemon: under what one connection may
  // queue (the budget, 1 MiB), most of the budget.
  const int hoarder = OpenSession();
  ASSERT_THAT(SendAll(hoarder, MalformedFetches(3000, 2)), IsOk());
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(HungUpByDaemon(hoarder));
  // The tenant's client asks for about 450 KiB before it reads: the two pass the budget.
  const int tenant = testing::OpenSessionSocketSession(
      ClientGroupSocketPathFor(socket_path(), "tenant"), "session_socket_limits_test");
  fds_.push_back(tenant);
  constexpr int kTenantFetches = 1500;
  ASSERT_THAT(SendAll(tenant, MalformedFetches(kTenantFetches, 2)), IsOk());
  const absl::Time deadline = absl::Now() + kTimeout;
  while (!HungUpByDaemon(hoarder) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(HungUpByDaemon(hoarder)) << "the client holding the most was not cut";
  std::string payload;
  for (int i = 0; i < kTenantFetches; ++i) {
    ASSERT_THAT(ReadFrame(tenant, payload), IsOk())
        << "the tenant's client was cut at answer " << i;
  }
  EXPECT_FALSE(HungUpByDaemon(tenant));
  EXPECT_THAT(Log(), HasSubstr("the most of any"));
}

TEST_F(SessionSocketLimitsTest, AGrpcSessionWhoseClientDoesNotReadIsCancelledPastTheBudget) {
  StartDaemon({"--max-unread-answer-bytes=1MiB"});
  ClientOptions options;
  options.socket_path = socket_path();
  auto client = Client::Connect(options);
  ASSERT_THAT(client, IsOk());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kTimeout));
  auto stream = (*client)->stub().Session(&context);
  ASSERT_TRUE(stream->Write(testing::OpenRequest(1, "session_socket_limits_test")));
  v1::SessionResponse response;
  ASSERT_TRUE(stream->Read(&response));
  ASSERT_EQ(response.code(), 0) << response.message();
  // 8 MiB of answers (about 300 bytes each) the client does not read: far more than HTTP/2's
  // windows hold, so they queue in the daemon until it cuts the stream. A write refused means the
  // stream is gone.
  constexpr int kRequests = 28000;
  int sent = 0;
  while (sent < kRequests && stream->Write(testing::FetchRequestFor(2 + sent, kLongMalformedKey)))
    ++sent;
  EXPECT_LT(sent, kRequests) << "the stream was not cut";
  // What did arrive may be read; then the stream ends cancelled.
  int answers = 0;
  while (stream->Read(&response)) ++answers;
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED)
      << status.error_message() << " after " << sent << " requests and " << answers << " answers";
  // One stream alone reaches the budget, which is also what one session may queue.
  EXPECT_THAT(Log(), HasSubstr("session stream: the client has not read"));
  EXPECT_THAT(Log(), HasSubstr("; cancelling it"));
  // The daemon serves on.
  auto stats = (*client)->GetStats();
  ASSERT_THAT(stats, IsOk());
}

}  // namespace
}  // namespace tierd

namespace tierd {
namespace {

// Tasks (threads) of user `uid` on the machine now, from /proc.
int TasksOfUser(uid_t uid) {
  int tasks = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::ifstream status(entry.path() / "status");
    std::string line;
    bool ours = false;
    while (std::getline(status, line)) {
      unsigned real = 0;
      if (std::sscanf(line.c_str(), "Uid: %u", &real) == 1) ours = real == uid;
      int threads = 0;
      if (ours && std::sscanf(line.c_str(), "Threads: %d", &threads) == 1) tasks += threads;
    }
  }
  return tasks;
}

// A session needs a thread on the host backend (its drain stream). When the system will not start
// one more (RLIMIT_NPROC here; a pids cgroup or TasksMax= alike), that session's open is
// RESOURCE_EXHAUSTED and the daemon serves on: it once died of the std::system_error.
TEST_F(SessionSocketLimitsTest, ASessionWhoseThreadCannotStartIsRefusedAndTheDaemonGoesOn) {
  constexpr uid_t kNobody = 65534;
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root: the daemon runs as another user, whose RLIMIT_NPROC binds it";
  }
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0777), 0);
  StartDaemon({}, {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"});
  ASSERT_NE(daemon_, nullptr);
  // A few threads more than the user has now: sessions soon run out of them. Set by a process of
  // the daemon's user, as it may without privileges: the soft limit only, so it can be lifted
  // again.
  auto limit_threads = [&](const std::string& soft) {
    return testing::RunProgram(
        {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/prlimit",
         "--pid", std::to_string(daemon_->pid()), absl::StrCat("--nproc=", soft, ":")},
        kTimeout);
  };
  auto limited = limit_threads(std::to_string(TasksOfUser(kNobody) + 4));
  ASSERT_THAT(limited, IsOk());
  ASSERT_EQ(limited->exit_code, 0);
  v1::SessionResponse refused;
  int opened = 0;
  for (int attempt = 0; attempt < 64 && refused.code() == 0; ++attempt) {
    const int fd = ConnectUnix(session_socket_path());
    fds_.push_back(fd);
    ASSERT_THAT(SendAll(fd, absl::StrCat(SessionSocketHello(),
                                         EncodeFrame(testing::OpenRequest(1, "thread-hungry")))),
                IsOk());
    std::string greeting(SessionSocketHello().size(), '\0');
    ASSERT_THAT(ReadExactly(fd, greeting.data(), greeting.size()), IsOk());
    std::string payload;
    ASSERT_THAT(ReadFrame(fd, payload), IsOk()) << "the daemon died at session " << attempt;
    ASSERT_TRUE(refused.ParseFromString(payload));
    if (refused.code() == 0) ++opened;
  }
  EXPECT_EQ(refused.code(), static_cast<int>(absl::StatusCode::kResourceExhausted))
      << refused.message();
  EXPECT_THAT(refused.message(), HasSubstr("cannot start the thread"));
  EXPECT_LE(opened, 4);

  // The limit lifted, the daemon serves new sessions and gRPC calls as before.
  rlimit inherited{};
  ASSERT_EQ(::getrlimit(RLIMIT_NPROC, &inherited), 0);  // the daemon's hard limit too
  auto lifted = limit_threads(
      inherited.rlim_max == RLIM_INFINITY ? "unlimited" : std::to_string(inherited.rlim_max));
  ASSERT_THAT(lifted, IsOk());
  ASSERT_EQ(lifted->exit_code, 0);
  OpenSession();
  ClientOptions options;
  options.socket_path = socket_path();
  auto client = Client::Connect(options);
  ASSERT_THAT(client, IsOk());
  EXPECT_THAT((*client)->GetStats(), IsOk());
}

}  // namespace
}  // namespace tierd
