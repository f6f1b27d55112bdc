// How a session's messages travel from its client's side: over the daemon's session socket
// (wire/session_socket.h, the fast path) or over the gRPC Session stream. SessionCore reads and
// writes through this; the C++ client and a daemon's peers pick the transport.
#ifndef TIERD_WIRE_SESSION_TRANSPORT_H_
#define TIERD_WIRE_SESSION_TRANSPORT_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "tierd/v1/tierd.grpc.pb.h"

namespace tierd {

class SessionTransport {
 public:
  virtual ~SessionTransport() = default;
  // Sends one request. One writer at a time; may run beside Read. False once the session is over.
  virtual bool Write(const v1::SessionRequest& request) = 0;
  // Sends `requests` in order, as one write where the transport can (the session socket: one
  // send of all their frames). As Write otherwise; false may leave some of them sent.
  virtual bool WriteMany(absl::Span<const v1::SessionRequest> requests) {
    for (const v1::SessionRequest& request : requests) {
      if (!Write(request)) return false;
    }
    return true;
  }
  // Waits for the next response. One reader at a time. False once the session is over.
  virtual bool Read(v1::SessionResponse& response) = 0;
  // Sends no more: the daemon ends the session, and Read returns false after the last answer.
  virtual void CloseWrites() = 0;
  // Ends the session at once, both ways, for a daemon that does not answer: a Read waiting in it
  // returns false. Any thread.
  virtual void Abort() = 0;
  // Why the session is over: OK when it ended after CloseWrites; otherwise UNAVAILABLE (or the
  // daemon's own status), its message naming the socket where the transport knows it (gRPC's
  // "failed to connect to all addresses; ... unix:PATH: ..."). REQUIRES: Read has returned false;
  // called once, by the reader.
  virtual absl::Status Finish() = 0;
  // "socket" or "grpc".
  virtual const char* kind() const = 0;
};

// Connects to a daemon's session socket and exchanges the greeting. UNAVAILABLE when nothing (or
// something else) listens at `path`. Reads busy-poll for up to `busy_poll` before they sleep
// (FrameReader).
absl::StatusOr<std::unique_ptr<SessionTransport>> ConnectSessionSocket(
    const std::string& path, absl::Duration busy_poll = absl::ZeroDuration());

// Starts the gRPC Session stream. UNAVAILABLE when it cannot be started.
absl::StatusOr<std::unique_ptr<SessionTransport>> StartGrpcSession(v1::Tierd::Stub& stub);

}  // namespace tierd

#endif  // TIERD_WIRE_SESSION_TRANSPORT_H_
