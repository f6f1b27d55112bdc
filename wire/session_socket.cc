#include "wire/session_socket.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/fd_io.h"
#include "common/posix_error.h"
#include "common/status_macros.h"

namespace tierd {

std::string SessionSocketPathFor(const std::string& grpc_socket) {
  absl::string_view base = grpc_socket;
  if (absl::ConsumeSuffix(&base, ".sock")) return absl::StrCat(base, ".session.sock");
  return absl::StrCat(grpc_socket, ".session");
}

std::string ClientGroupSocketPathFor(const std::string& grpc_socket, const std::string& group) {
  absl::string_view base = grpc_socket;
  if (absl::ConsumeSuffix(&base, ".sock")) return absl::StrCat(base, ".", group, ".session.sock");
  return absl::StrCat(grpc_socket, ".", group, ".session");
}

namespace {

// A frame of `length` payload bytes with its length written; the payload is left to the caller.
std::string FrameOf(size_t length) {
  std::string frame(4 + length, '\0');
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return frame;
}

}  // namespace

std::string EncodeFrame(absl::string_view payload) {
  std::string frame = FrameOf(payload.size());
  std::memcpy(frame.data() + 4, payload.data(), payload.size());
  return frame;
}

std::string EncodeFrame(const google::protobuf::MessageLite& message) {
  std::string frame = FrameOf(message.ByteSizeLong());
  message.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(frame.data() + 4));
  return frame;
}

absl::Status SendAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t sent = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      return PosixError("sending on the session socket", errno);  // EPIPE, ECONNRESET: UNAVAILABLE
    }
    data.remove_prefix(static_cast<size_t>(sent));
  }
  return absl::OkStatus();
}

absl::Status ReadExactly(int fd, char* data, size_t bytes) {
  // A reset connection is UNAVAILABLE (PosixError maps ECONNRESET so).
  absl::StatusOr<size_t> got = ReadUpTo(fd, data, bytes, "the session socket");
  if (!got.ok()) return got.status();
  if (*got == bytes) return absl::OkStatus();
  if (*got == 0) return absl::OutOfRangeError("the session socket was closed");
  return absl::UnavailableError("the session socket was closed inside a message");
}

namespace {

absl::Status ClosedInsideAMessage() {
  return absl::UnavailableError("the session socket was closed inside a message");
}

// Reads exactly `bytes` bytes of a frame already begun, waiting for more until `deadline` at the
// latest. UNAVAILABLE when the stream ends or breaks, DEADLINE_EXCEEDED at the deadline.
absl::Status ReadRestBefore(int fd, char* data, size_t bytes, absl::Time deadline) {
  size_t got = 0;
  while (got < bytes) {
    const ssize_t read = ::recv(fd, data + got, bytes - got, MSG_DONTWAIT);
    if (read > 0) {
      got += static_cast<size_t>(read);
      continue;
    }
    if (read == 0) return ClosedInsideAMessage();
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return PosixError("reading the session socket", errno);  // ECONNRESET: UNAVAILABLE
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError("the rest of a message did not arrive in time");
    }
    pollfd readable{fd, POLLIN, 0};
    const int64_t wait_ms = std::min<int64_t>(absl::ToInt64Milliseconds(left), 60'000) + 1;
    if (::poll(&readable, 1, static_cast<int>(wait_ms)) < 0 && errno != EINTR) {
      return PosixError("waiting on the session socket", errno);
    }
  }
  return absl::OkStatus();
}

// The rest of a frame whose first `first` bytes are in `header`: the rest of its length, then its
// payload, each through `read_rest(data, bytes)`, which reads exactly that many bytes.
template <typename ReadRest>
absl::Status ReadFrameRest(unsigned char (&header)[4], size_t first, std::string& payload,
                           ReadRest read_rest) {
  RETURN_IF_ERROR(read_rest(reinterpret_cast<char*>(header) + first, 4 - first));
  const uint32_t length =
      header[0] | (header[1] << 8) | (header[2] << 16) | (static_cast<uint32_t>(header[3]) << 24);
  if (length > MaxSessionFrameBytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a session message of ", length, " bytes; the limit is ", MaxSessionFrameBytes()));
  }
  // Grown as the bytes arrive: a length alone does not get its memory.
  constexpr uint32_t kStep = 1u << 20;
  payload.clear();
  while (payload.size() < length) {
    const size_t at = payload.size();
    payload.resize(at + std::min<uint32_t>(kStep, length - static_cast<uint32_t>(at)));
    RETURN_IF_ERROR(read_rest(payload.data() + at, payload.size() - at));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadFrame(int fd, std::string& payload) {
  unsigned char header[4];
  RETURN_IF_ERROR(ReadExactly(fd, reinterpret_cast<char*>(header), 4));
  return ReadFrameRest(header, 4, payload, [fd](char* data, size_t bytes) {
    absl::Status status = ReadExactly(fd, data, bytes);
    return absl::IsOutOfRange(status) ? ClosedInsideAMessage() : status;
  });
}

absl::Status ReadFrameWithin(int fd, std::string& payload, absl::Duration rest_within) {
  // One blocking read for the first bytes of the length, however long they take to come.
  unsigned char header[4];
  ssize_t first;
  do {
    first = ::read(fd, header, sizeof(header));
  } while (first < 0 && errno == EINTR);
  if (first < 0) return PosixError("reading the session socket", errno);
  if (first == 0) return absl::OutOfRangeError("the session socket was closed");
  const absl::Time deadline = absl::Now() + rest_within;
  return ReadFrameRest(header, static_cast<size_t>(first), payload,
                       [fd, deadline](char* data, size_t bytes) {
                         return ReadRestBefore(fd, data, bytes, deadline);
                       });
}

}  // namespace tierd
