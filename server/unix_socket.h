// Preparing the Unix socket path a daemon listens on.
#ifndef TIERD_SERVER_UNIX_SOCKET_H_
#define TIERD_SERVER_UNIX_SOCKET_H_

#include <sys/types.h>

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tierd {

// Makes `path` ready to bind: checks it fits in sockaddr_un, creates missing parent directories,
// and removes a stale socket left by a daemon that died. Errors: INVALID_ARGUMENT for a path that
// is too long or empty; FAILED_PRECONDITION when a live server already answers on it or the path
// is something other than a socket (never deleted).
absl::Status PrepareSocketPath(const std::string& path);

// The group id of group `name`. INVALID_ARGUMENT naming --socket-group when there is none.
absl::StatusOr<gid_t> LookupSocketGroup(const std::string& name);

// Gives the socket at `path` mode 0660 and, unless `group` is nullopt, that group: whoever may use
// the GPU through the daemon is in the socket's group; nobody else.
absl::Status SetSocketAccess(const std::string& path, std::optional<gid_t> group);

}  // namespace tierd

#endif  // TIERD_SERVER_UNIX_SOCKET_H_
