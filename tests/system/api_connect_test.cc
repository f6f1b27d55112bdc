// Connecting to a daemon that is slow to answer: on a loaded node (many clients starting at once,
// a daemon busy with its own work) a new connection's HTTP/2 handshake may take far longer than a
// local socket usually does. The client must wait for it, as long as the call's own deadline
// allows, rather than give up on the connection and fail the call UNAVAILABLE.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "tests/system/api_test_fixture.h"

namespace tierd {
namespace api_test {
namespace {

// Listens on a Unix socket and relays each connection to `target` once `delay` has passed since
// it was accepted: to the client, a daemon that answers its handshake `delay` late.
class SlowRelay {
 public:
  SlowRelay(std::string path, std::string target, absl::Duration delay)
      : path_(std::move(path)), target_(std::move(target)), delay_(delay) {}
  ~SlowRelay() {
    stop_ = true;
    if (listener_ >= 0) ::shutdown(listener_, SHUT_RDWR);
    if (acceptor_.joinable()) acceptor_.join();
    for (std::thread& relay : relays_) relay.join();
    if (listener_ >= 0) ::close(listener_);
  }

  absl::Status Start() {
    listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener_ < 0) return absl::InternalError("socket");
    sockaddr_un address = Address(path_);
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        ::listen(listener_, 8) != 0) {
      return absl::InternalError(absl::StrCat("cannot listen on ", path_));
    }
    acceptor_ = std::thread([this] { Accept(); });
    return absl::OkStatus();
  }

  int accepted() const { return accepted_.load(); }

 private:
  static sockaddr_un Address(const std::string& path) {
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    path.copy(address.sun_path, sizeof(address.sun_path) - 1);
    return address;
  }

  void Accept() {
    // A client makes one connection per attempt; a handful is all a test's calls need.
    while (!stop_ && relays_.size() < 8) {
      const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) return;
      ++accepted_;
      relays_.emplace_back([this, client] { Relay(client); });
    }
  }

  void Relay(int client) {
    const absl::Time until = absl::Now() + delay_;
    while (!stop_ && absl::Now() < until) absl::SleepFor(absl::Milliseconds(10));
    const int daemon = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address = Address(target_);
    if (daemon >= 0 && !stop_ &&
        ::connect(daemon, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
      Pump(client, daemon);
    }
    if (daemon >= 0) ::close(daemon);
    ::close(client);
  }

  // Copies bytes both ways until either side closes or the relay stops.
  void Pump(int a, int b) {
    char buffer[64 << 10];
    pollfd fds[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    while (!stop_) {
      if (::poll(fds, 2, 50) < 0) return;
      for (int i = 0; i < 2; ++i) {
        if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        const ssize_t n = ::read(fds[i].fd, buffer, sizeof(buffer));
        if (n <= 0) return;
        for (ssize_t sent = 0; sent < n;) {
          const ssize_t wrote = ::write(fds[1 - i].fd, buffer + sent, n - sent);
          if (wrote <= 0) return;
          sent += wrote;
        }
      }
    }
  }

  const std::string path_;
  const std::string target_;
  const absl::Duration delay_;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  int listener_ = -1;
  std::thread acceptor_;
  std::vector<std::thread> relays_;  // touched by the acceptor thread only, until it is joined
};

// The daemon answers a new connection 1.5 s late (ten times gRPC's reconnect backoff the client
// asks for): unary calls and a session still go through, on the first connection.
TEST_F(ApiTest, AClientWaitsForADaemonSlowToAnswerItsConnection) {
  SlowRelay relay(model_dir("slow.sock"), socket_path(), absl::Milliseconds(1500));
  ASSERT_THAT(relay.Start(), IsOk());
  ClientOptions options;
  options.socket_path = model_dir("slow.sock");
  options.client_name = "api_connect_test";
  auto client = Client::Connect(options);
  ASSERT_THAT(client, IsOk());

  const absl::Time start = absl::Now();
  auto stats = (*client)->GetStats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(1400)) << "the relay did not hold it back";
  auto session = (*client)->OpenSession();
  ASSERT_THAT(session, IsOk());
  auto lease = (*session)->Fetch(Key(0));
  ASSERT_THAT(lease, IsOk());
  ExpectTensorsMatch(**session, *lease);
  lease->Release();
  session->reset();
  client->reset();
  EXPECT_EQ(relay.accepted(), 1) << "the client gave up on a connection and made another";
}

}  // namespace
}  // namespace api_test
}  // namespace tierd
