// The session socket: a Unix stream socket beside the gRPC one that carries the Session stream's
// messages (tierd.v1.SessionRequest / SessionResponse, the same protocol) without HTTP/2. On the
// GPU machine a round trip on the gRPC session stream costs 66 µs at p50, on this socket 34 µs,
// and a fetch 91 µs against 42 µs (bench/results/README.md).
//
// Wire format (proto/tierd/v1/wire.proto, SessionSocketFormat): the client first sends
// SessionSocketHello() and the daemon answers with it; then each message is a frame: its length
// (a little-endian uint32, at most MaxSessionFrameBytes()) followed by the serialized message.
// Requests go one way, responses the other, exactly as on the gRPC stream; closing the connection
// ends the session. The daemon's side is server/session_socket_server.h, the client's
// wire/session_transport.h; both frame and read through here.
#ifndef TIERD_WIRE_SESSION_SOCKET_H_
#define TIERD_WIRE_SESSION_SOCKET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "google/protobuf/message_lite.h"
#include "wire/wire_format.h"

namespace tierd {

// Where the daemon serving gRPC on `grpc_socket` listens for sessions: "X.sock" → "X.session.sock",
// any other path gets ".session" appended.
std::string SessionSocketPathFor(const std::string& grpc_socket);
// Where client group `group` (tierd --client-groups) opens its sessions on that daemon:
// "X.sock" → "X.GROUP.session.sock", any other path gets ".GROUP.session" appended.
std::string ClientGroupSocketPathFor(const std::string& grpc_socket, const std::string& group);

// `payload` with its length in front.
std::string EncodeFrame(absl::string_view payload);
// `message` serialized with its length in front, in one buffer (the data path's encoding).
std::string EncodeFrame(const google::protobuf::MessageLite& message);

// The payload length a frame begins with, from its first 4 bytes at `header`. INVALID_ARGUMENT
// for a length over MaxSessionFrameBytes().
absl::StatusOr<uint32_t> DecodeFrameLength(const char* header);

// Sends all of `data` (blocking), without SIGPIPE. Errors: UNAVAILABLE when the peer is gone,
// other POSIX errors as Status.
absl::Status SendAll(int fd, absl::string_view data);

// Reads one frame into `payload`. OUT_OF_RANGE when the stream ended cleanly before a frame began;
// UNAVAILABLE when it ended inside one or the connection broke; INVALID_ARGUMENT for a length
// over MaxSessionFrameBytes().
absl::Status ReadFrame(int fd, std::string& payload);

// Reads exactly `bytes` bytes. OUT_OF_RANGE when the stream ended before the first byte,
// UNAVAILABLE when it ended later or broke.
absl::Status ReadExactly(int fd, char* data, size_t bytes);

// Reads frames through a buffer: each system call takes as many bytes as the socket has, up to
// the buffer's size, so frames sent back to back (a release, then the next fetch) cost one read
// instead of two each. The data path's readers, on both ends, use one per connection. Not
// thread-safe; the fd must outlive it, and nobody else may read from it.
//
// With `busy_poll`, a reader that finds nothing buffered first polls the socket without blocking
// for up to that long, yielding the CPU to any other runnable thread between tries, and only then
// sleeps in read(): a frame that arrives meanwhile wakes no thread (on a virtual machine a
// wake-up crosses the hypervisor), at the price of that much CPU when none comes.
class FrameReader {
 public:
  static constexpr size_t kBufferBytes = 64 << 10;

  explicit FrameReader(int fd, absl::Duration busy_poll = absl::ZeroDuration())
      : fd_(fd), busy_poll_(busy_poll), buffer_(kBufferBytes) {}
  FrameReader(const FrameReader&) = delete;
  FrameReader& operator=(const FrameReader&) = delete;

  // The next frame, as ReadFrame. With `rest_within`, for a server that will not wait for ever on
  // a client stalled inside a frame: waiting for a frame to begin has no limit, but once its first
  // byte has arrived the rest must arrive within `rest_within`, else DEADLINE_EXCEEDED.
  absl::Status Next(std::string& payload, absl::Duration rest_within = absl::InfiniteDuration());

 private:
  size_t buffered() const { return end_ - begin_; }
  // Reads until `bytes` are buffered (REQUIRES: bytes <= the buffer's size), waiting no later
  // than `deadline`. UNAVAILABLE when the stream ends or breaks, DEADLINE_EXCEEDED after it.
  absl::Status Fill(size_t bytes, absl::Time deadline);

  // Polls without blocking for up to busy_poll_ into the empty buffer: how many bytes came (0:
  // none in time), or the end of the stream as Next reports it.
  absl::StatusOr<size_t> PollFirstBytes();

  const int fd_;
  const absl::Duration busy_poll_;
  std::vector<char> buffer_;
  size_t begin_ = 0;  // buffered bytes are [begin_, end_)
  size_t end_ = 0;
};

}  // namespace tierd

#endif  // TIERD_WIRE_SESSION_SOCKET_H_
