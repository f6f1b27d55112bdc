#include "wire/session_socket.h"

#include <poll.h>
#include <sched.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/status/statusor.h"
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

absl::StatusOr<uint32_t> DecodeFrameLength(const char* header) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(header);
  const uint32_t length =
      bytes[0] | (bytes[1] << 8) | (bytes[2] << 16) | (static_cast<uint32_t>(bytes[3]) << 24);
  if (length > MaxSessionFrameBytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a session message of ", length, " bytes; the limit is ", MaxSessionFrameBytes()));
  }
  return length;
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

// Reads at least `at_least` and at most `at_most` bytes of a frame already begun into `data`,
// waiting for more until `deadline` at the latest; returns how many it read. UNAVAILABLE when the
// stream ends or breaks, DEADLINE_EXCEEDED at the deadline.
absl::StatusOr<size_t> ReadBefore(int fd, char* data, size_t at_least, size_t at_most,
                                  absl::Time deadline) {
  size_t got = 0;
  while (got < at_least) {
    const ssize_t read = ::recv(fd, data + got, at_most - got, MSG_DONTWAIT);
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
  return got;
}

// Reads exactly `bytes` bytes of a frame already begun, as ReadBefore.
absl::Status ReadRestBefore(int fd, char* data, size_t bytes, absl::Time deadline) {
  return ReadBefore(fd, data, bytes, bytes, deadline).status();
}

// The rest of a frame whose first `first` bytes are in `header`: the rest of its length, then its
// payload, each through `read_rest(data, bytes)`, which reads exactly that many bytes.
template <typename ReadRest>
absl::Status ReadFrameRest(unsigned char (&header)[4], size_t first, std::string& payload,
                           ReadRest read_rest) {
  RETURN_IF_ERROR(read_rest(reinterpret_cast<char*>(header) + first, 4 - first));
  ASSIGN_OR_RETURN(const uint32_t length, DecodeFrameLength(reinterpret_cast<char*>(header)));
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

}  // namespace tierd

namespace tierd {

absl::Status FrameReader::Fill(size_t bytes, absl::Time deadline) {
  if (begin_ + bytes > buffer_.size()) {
    // Too little room behind the buffered bytes: move them to the front.
    std::memmove(buffer_.data(), buffer_.data() + begin_, buffered());
    end_ -= begin_;
    begin_ = 0;
  }
  if (buffered() >= bytes) return absl::OkStatus();
  ASSIGN_OR_RETURN(const size_t read, ReadBefore(fd_, buffer_.data() + end_, bytes - buffered(),
                                                 buffer_.size() - end_, deadline));
  end_ += read;
  return absl::OkStatus();
}

absl::StatusOr<size_t> FrameReader::PollFirstBytes() {
  const absl::Time until = absl::Now() + busy_poll_;
  while (true) {
    const ssize_t read = ::recv(fd_, buffer_.data(), buffer_.size(), MSG_DONTWAIT);
    if (read > 0) return static_cast<size_t>(read);
    if (read == 0) return absl::OutOfRangeError("the session socket was closed");
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return PosixError("reading the session socket", errno);
    }
    if (absl::Now() >= until) return 0;
    ::sched_yield();
  }
}

absl::Status FrameReader::Next(std::string& payload, absl::Duration rest_within) {
  if (buffered() == 0) {
    begin_ = end_ = 0;
    if (busy_poll_ > absl::ZeroDuration()) {
      ASSIGN_OR_RETURN(end_, PollFirstBytes());
    }
  }
  if (buffered() == 0) {
    // One blocking read for the first bytes, however long they take to come.
    ssize_t read;
    do {
      read = ::read(fd_, buffer_.data(), buffer_.size());
    } while (read < 0 && errno == EINTR);
    if (read < 0) return PosixError("reading the session socket", errno);
    if (read == 0) return absl::OutOfRangeError("the session socket was closed");
    end_ = static_cast<size_t>(read);
  }
  const absl::Time deadline =
      rest_within == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + rest_within;
  RETURN_IF_ERROR(Fill(4, deadline));
  ASSIGN_OR_RETURN(const uint32_t length, DecodeFrameLength(buffer_.data() + begin_));
  begin_ += 4;
  if (length <= buffer_.size()) {
    RETURN_IF_ERROR(Fill(length, deadline));
    payload.assign(buffer_.data() + begin_, length);
    begin_ += length;
    return absl::OkStatus();
  }
  // Larger than the buffer: what is buffered, then the rest read into the payload itself, grown
  // as the bytes arrive (a length alone does not get its memory).
  payload.assign(buffer_.data() + begin_, buffered());
  begin_ = end_ = 0;
  constexpr uint32_t kStep = 1u << 20;
  while (payload.size() < length) {
    const size_t at = payload.size();
    payload.resize(at + std::min<uint32_t>(kStep, length - static_cast<uint32_t>(at)));
    RETURN_IF_ERROR(ReadRestBefore(fd_, payload.data() + at, payload.size() - at, deadline));
  }
  return absl::OkStatus();
}

}  // namespace tierd
