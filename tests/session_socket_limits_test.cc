// The session socket's bounds against clients that misbehave, on a daemon process: a frame begun
// must be finished within SessionSocketServer::kFrameTimeout, while a connection idle between
// frames may stay.
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/session_socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/session_socket_server.h"
#include "tests/daemon_test_support.h"
#include "tests/test_support.h"
#include "tierd/v1/tierd.pb.h"

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

v1::SessionRequest Open(uint64_t id) {
  v1::SessionRequest request;
  request.set_request_id(id);
  request.mutable_open()->set_client_name("session_socket_limits_test");
  return request;
}

v1::SessionRequest Prefetch(uint64_t id, const std::string& key) {
  v1::SessionRequest request;
  request.set_request_id(id);
  request.mutable_prefetch()->add_keys(key);
  return request;
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

  // Starts tierd with `flags` besides the usual ones, its log going to log_path().
  void StartDaemon(const std::vector<std::string>& flags = {}) {
    std::vector<std::string> argv = {"/bin/sh",
                                     "-c",
                                     absl::StrCat("exec \"$0\" \"$@\" 2>", log_path()),
                                     SiblingBinary("tierd"),
                                     "--device=host",
                                     absl::StrCat("--socket=", socket_path()),
                                     absl::StrCat("--state-dir=", dir_.path(), "/state"),
                                     "--host-cache-bytes=16MiB",
                                     "--gpu-pool-bytes=2MiB",
                                     "--gpu-slab-bytes=1MiB",
                                     "--shutdown-grace-ms=1000"};
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
    const int fd = ConnectUnix(session_socket_path());
    fds_.push_back(fd);
    EXPECT_THAT(SendAll(fd, absl::StrCat(kSessionSocketHello, EncodeFrame(Open(1)))), IsOk());
    std::string greeting(kSessionSocketHello.size(), '\0');
    EXPECT_THAT(ReadExactly(fd, greeting.data(), greeting.size()), IsOk());
    std::string payload;
    EXPECT_THAT(ReadFrame(fd, payload), IsOk());
    v1::SessionResponse opened;
    EXPECT_TRUE(opened.ParseFromString(payload));
    EXPECT_EQ(opened.code(), 0) << opened.message();
    return fd;
  }

  TempDir dir_;
  std::unique_ptr<Subprocess> daemon_;
  std::vector<int> fds_;
};

TEST_F(SessionSocketLimitsTest, AFrameLeftUnfinishedIsClosedAfterTheFrameTimeoutButAnIdleOneIsNot) {
  StartDaemon();
  const std::string frame = EncodeFrame(Prefetch(2, "m/nothing"));
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
  ASSERT_THAT(SendAll(idle, EncodeFrame(Prefetch(3, "m/nothing"))), IsOk());
  ASSERT_THAT(ReadFrame(idle, payload), IsOk());
  v1::SessionResponse answer;
  ASSERT_TRUE(answer.ParseFromString(payload));
  EXPECT_EQ(answer.request_id(), 3u);
}

}  // namespace
}  // namespace tierd
