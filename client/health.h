// Asking a tierd whether it serves: the standard grpc.health.v1 check over its Unix socket.
#ifndef TIERD_CLIENT_HEALTH_H_
#define TIERD_CLIENT_HEALTH_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tierd {

// Returns the serving status the daemon reports ("SERVING", "NOT_SERVING", ...), or the call's
// error (UNAVAILABLE when nothing listens, DEADLINE_EXCEEDED after `timeout`).
absl::StatusOr<std::string> CheckHealth(const std::string& socket_path, absl::Duration timeout);

// "unix:PATH", the gRPC target of a socket path.
std::string UnixTarget(const std::string& socket_path);

}  // namespace tierd

namespace grpc {
class Status;
}  // namespace grpc

namespace tierd {

// A gRPC status as an absl::Status with the same code and message.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace tierd

#endif  // TIERD_CLIENT_HEALTH_H_
