#include "common/session_socket.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "common/fd_io.h"
#include "common/posix_error.h"

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

absl::Status ReadFrame(int fd, std::string& payload) {
  unsigned char header[4];
  if (absl::Status status = ReadExactly(fd, reinterpret_cast<char*>(header), 4); !status.ok()) {
    return status;
  }
  const uint32_t length = header[0] | (header[1] << 8) | (header[2] << 16) |
                          (static_cast<uint32_t>(header[3]) << 24);
  if (length > kMaxSessionFrameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a session message of ", length,
                                                   " bytes; the limit is ", kMaxSessionFrameBytes));
  }
  // Grown as the bytes arrive: a length alone does not get its memory.
  constexpr uint32_t kStep = 1u << 20;
  payload.clear();
  while (payload.size() < length) {
    const size_t at = payload.size();
    payload.resize(at + std::min<uint32_t>(kStep, length - static_cast<uint32_t>(at)));
    absl::Status status = ReadExactly(fd, payload.data() + at, payload.size() - at);
    if (absl::IsOutOfRange(status)) {
      return absl::UnavailableError("the session socket was closed inside a message");
    }
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

}  // namespace tierd
