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

// OK when this process may give its files group `gid` (`name`): it is root, or the group is its
// own or one of its supplementary groups. Otherwise INVALID_ARGUMENT naming `flag`, the user and
// the group, and how to mend it: binding a socket would succeed and giving it the group would not.
absl::Status CheckMayGiveGroup(gid_t gid, const std::string& name, const std::string& flag);

// Gives the socket at `path` mode 0660 and, unless `group` is nullopt, that group: whoever may use
// the GPU through the daemon is in the socket's group; nobody else.
absl::Status SetSocketAccess(const std::string& path, std::optional<gid_t> group);

}  // namespace tierd

#endif  // TIERD_SERVER_UNIX_SOCKET_H_
