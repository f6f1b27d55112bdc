#include "client/session_transport.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/session_socket.h"

namespace tierd {
namespace {

class SocketTransport final : public SessionTransport {
 public:
  explicit SocketTransport(int fd) : fd_(fd) {}
  ~SocketTransport() override { ::close(fd_); }

  bool Write(const v1::SessionRequest& request) override {
    return SendAll(fd_, EncodeFrame(request)).ok();
  }
  bool Read(v1::SessionResponse& response) override {
    return ReadFrame(fd_, payload_).ok() && response.ParseFromString(payload_);
  }
  void CloseWrites() override { ::shutdown(fd_, SHUT_WR); }
  const char* kind() const override { return "socket"; }

 private:
  const int fd_;
  std::string payload_;  // the reader's buffer
};

class GrpcTransport final : public SessionTransport {
 public:
  ~GrpcTransport() override {
    if (stream_ == nullptr) return;  // never started
    grpc::Status status = stream_->Finish();
    (void)status;  // the session is over either way
  }

  bool Write(const v1::SessionRequest& request) override { return stream_->Write(request); }
  bool Read(v1::SessionResponse& response) override { return stream_->Read(&response); }
  void CloseWrites() override { stream_->WritesDone(); }
  const char* kind() const override { return "grpc"; }

  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionResponse>> stream_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SessionTransport>> ConnectSessionSocket(const std::string& path) {
  sockaddr_un address{};
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("not a usable socket path: ", path));
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  auto transport = std::make_unique<SocketTransport>(fd);
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  // Connecting and the greeting have a deadline (a Unix connect waits while the listener's backlog
  // is full; SO_SNDTIMEO bounds it): whatever listens there must be a tierd that answers, else the
  // gRPC stream serves.
  timeval timeout{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return absl::UnavailableError(absl::StrCat("connecting to ", path, ": ", std::strerror(errno)));
  }
  std::string hello(kSessionSocketHello.size(), '\0');
  if (!SendAll(fd, kSessionSocketHello).ok() ||
      !ReadExactly(fd, hello.data(), hello.size()).ok() || hello != kSessionSocketHello) {
    return absl::UnavailableError(absl::StrCat(path, " is not a tierd session socket"));
  }
  timeval none{0, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof(none));
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
  return transport;
}

absl::StatusOr<std::unique_ptr<SessionTransport>> StartGrpcSession(v1::Tierd::Stub& stub) {
  auto transport = std::make_unique<GrpcTransport>();
  transport->stream_ = stub.Session(&transport->context_);
  if (transport->stream_ == nullptr) return absl::UnavailableError("cannot start a session");
  return transport;
}

}  // namespace tierd
