// Preparing the Unix socket path a daemon listens on.
#ifndef TIERD_SERVER_UNIX_SOCKET_H_
#define TIERD_SERVER_UNIX_SOCKET_H_

#include <string>

#include "absl/status/status.h"

namespace tierd {

// Makes `path` ready to bind: checks it fits in sockaddr_un, creates missing parent directories,
// and removes a stale socket left by a daemon that died. Errors: INVALID_ARGUMENT for a path that
// is too long or empty; FAILED_PRECONDITION when a live server already answers on it or the path
// is something other than a socket (never deleted).
absl::Status PrepareSocketPath(const std::string& path);

}  // namespace tierd

#endif  // TIERD_SERVER_UNIX_SOCKET_H_
