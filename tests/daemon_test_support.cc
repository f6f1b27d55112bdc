#include "tests/daemon_test_support.h"

#include <sys/socket.h>
#include <sys/un.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/health.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "wire/session_socket.h"
#include "wire/wire_format.h"

namespace tierd::testing {

absl::StatusOr<std::unique_ptr<Subprocess>> StartServingDaemon(const std::vector<std::string>& argv,
                                                               const std::string& socket_path,
                                                               absl::Duration timeout) {
  ASSIGN_OR_RETURN(std::unique_ptr<Subprocess> daemon, Subprocess::Start(argv));
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<std::string> health;
  while (absl::Now() < deadline) {
    health = CheckHealth(socket_path, absl::Seconds(1));
    if (health.ok() && *health == "SERVING") return daemon;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "tierd did not become SERVING on ", socket_path, " within ", absl::FormatDuration(timeout),
      "; last health: ", health.ok() ? *health : health.status().ToString()));
}

absl::StatusOr<RunResult> RunTierctl(const std::string& socket_path,
                                     const std::vector<std::string>& args, absl::Duration timeout,
                                     bool with_stderr) {
  std::vector<std::string> argv = {SiblingBinary("tierctl"),
                                   absl::StrCat("--socket=", socket_path)};
  argv.insert(argv.end(), args.begin(), args.end());
  return with_stderr ? RunProgramWithStderr(argv, timeout) : RunProgram(argv, timeout);
}

absl::Status StoreBytes(Session& session, const std::string& key, const std::string& bytes,
                        StoreRequest request) {
  request.key = key;
  request.data = bytes.data();
  request.size = bytes.size();
  RETURN_IF_ERROR(session.StoreAsync(request));
  const absl::Status committed = session.Flush();
  // `bytes` must outlive the copy from it; only a successful commit waits for that.
  RETURN_IF_ERROR(session.device().SynchronizeStream(session.default_stream()));
  return committed;
}

int ConnectUnix(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0) << path;
  return fd;
}

absl::StatusOr<std::string> FetchBytes(Session& session, const std::string& key) {
  ASSIGN_OR_RETURN(Lease lease, session.Fetch(key));
  std::string bytes = LeaseBytes(session, lease);
  lease.Release();
  return bytes;
}

absl::StatusOr<v1::EvictResponse> EvictOnceFree(Session& session, const std::string& key,
                                                v1::Tier tier) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (true) {
    absl::StatusOr<v1::EvictResponse> evicted = session.Evict(key, tier);
    if (evicted.status().code() != absl::StatusCode::kFailedPrecondition ||
        absl::Now() > deadline) {
      return evicted;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

std::string LeaseBytes(Session& session, const Lease& lease) {
  std::string bytes(lease.size(), '\0');
  EXPECT_TRUE(session.device()
                  .CopyAsync(session.default_stream(), bytes.data(), lease.data(), lease.size())
                  .ok());
  EXPECT_TRUE(session.device().SynchronizeStream(session.default_stream()).ok());
  return bytes;
}

int OpenSessionSocketSession(const std::string& session_socket_path,
                             const std::string& client_name) {
  const int fd = ConnectUnix(session_socket_path);
  EXPECT_THAT(
      SendAll(fd, absl::StrCat(SessionSocketHello(), EncodeFrame(OpenRequest(1, client_name)))),
      IsOk());
  std::string greeting(SessionSocketHello().size(), '\0');
  EXPECT_THAT(ReadExactly(fd, greeting.data(), greeting.size()), IsOk());
  std::string payload;
  EXPECT_THAT(ReadFrame(fd, payload), IsOk());
  v1::SessionResponse opened;
  EXPECT_TRUE(opened.ParseFromString(payload));
  EXPECT_EQ(opened.code(), 0) << opened.message();
  return fd;
}

v1::SessionRequest OpenRequest(uint64_t id, const std::string& client_name) {
  v1::SessionRequest request;
  request.set_request_id(id);
  request.mutable_open()->set_client_name(client_name);
  request.mutable_open()->set_protocol(SessionProtocolVersion());
  return request;
}

v1::SessionRequest FetchRequestFor(uint64_t id, const std::string& key) {
  v1::SessionRequest request;
  request.set_request_id(id);
  request.mutable_fetch()->set_key(key);
  return request;
}

v1::SessionRequest PinRequestFor(uint64_t id, const std::string& key) {
  v1::SessionRequest request;
  request.set_request_id(id);
  request.mutable_pin()->set_key(key);
  return request;
}

v1::SessionRequest PrefetchRequestFor(uint64_t id, const std::string& key) {
  v1::SessionRequest request;
  request.set_request_id(id);
  request.mutable_prefetch()->add_keys(key);
  return request;
}

}  // namespace tierd::testing
