#include "wire/session_transport.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "wire/session_socket.h"

namespace tierd {
namespace {

class SocketTransport final : public SessionTransport {
 public:
  SocketTransport(int fd, std::string path, absl::Duration busy_poll)
      : fd_(fd), path_(std::move(path)), reader_(fd, busy_poll) {}
  ~SocketTransport() override { ::close(fd_); }

  bool Write(const v1::SessionRequest& request) override {
    return SendAll(fd_, EncodeFrame(request)).ok();
  }
  bool WriteMany(absl::Span<const v1::SessionRequest> requests) override {
    std::string frames;
    for (const v1::SessionRequest& request : requests) frames += EncodeFrame(request);
    return SendAll(fd_, frames).ok();
  }
  bool Read(v1::SessionResponse& response) override {
    read_status_ = reader_.Next(payload_);
    if (read_status_.ok() && !response.ParseFromString(payload_)) {
      read_status_ = absl::DataLossError("a response that does not parse");
    }
    return read_status_.ok();
  }
  void CloseWrites() override {
    writes_closed_ = true;
    ::shutdown(fd_, SHUT_WR);
  }
  void Abort() override { ::shutdown(fd_, SHUT_RDWR); }
  absl::Status Finish() override {
    // A clean end of the stream after our own end of it is the session's normal end.
    if (writes_closed_ && absl::IsOutOfRange(read_status_)) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat(path_, ": ", read_status_.message()));
  }
  const char* kind() const override { return "socket"; }

 private:
  const int fd_;
  const std::string path_;
  FrameReader reader_;        // the reading thread's alone (one at a time), like the two below
  std::string payload_;       // the frame read last
  absl::Status read_status_;  // of the last Read
  std::atomic<bool> writes_closed_{false};
};

class GrpcTransport final : public SessionTransport {
 public:
  ~GrpcTransport() override {
    if (stream_ == nullptr || finished_) return;  // never started, or finished by the reader
    grpc::Status status = stream_->Finish();
    (void)status;  // the session is over either way
  }

  bool Write(const v1::SessionRequest& request) override { return stream_->Write(request); }
  bool WriteMany(absl::Span<const v1::SessionRequest> requests) override {
    // All but the last may wait in gRPC's buffer: they go out together.
    for (size_t i = 0; i < requests.size(); ++i) {
      grpc::WriteOptions options;
      if (i + 1 < requests.size()) options.set_buffer_hint();
      if (!stream_->Write(requests[i], options)) return false;
    }
    return true;
  }
  bool Read(v1::SessionResponse& response) override { return stream_->Read(&response); }
  void CloseWrites() override { stream_->WritesDone(); }
  void Abort() override { context_.TryCancel(); }
  absl::Status Finish() override {
    finished_ = true;
    const grpc::Status status = stream_->Finish();
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  }
  const char* kind() const override { return "grpc"; }

  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionResponse>> stream_;
  bool finished_ = false;  // the reader's, read again only once it has been joined
};

}  // namespace

absl::StatusOr<std::unique_ptr<SessionTransport>> ConnectSessionSocket(const std::string& path,
                                                                       absl::Duration busy_poll) {
  sockaddr_un address{};
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("not a usable socket path: ", path));
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  auto transport = std::make_unique<SocketTransport>(fd, path, busy_poll);
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
  std::string hello(SessionSocketHello().size(), '\0');
  if (!SendAll(fd, SessionSocketHello()).ok() ||
      !ReadExactly(fd, hello.data(), hello.size()).ok() || hello != SessionSocketHello()) {
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
