#include "server/unix_socket.h"

#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/posix_error.h"

namespace tierd {
namespace {

// True when something accepts connections on `path`.
bool SomeoneListens(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  struct sockaddr_un address = {};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  const bool connected =
      ::connect(fd, reinterpret_cast<const struct sockaddr*>(&address), sizeof(address)) == 0;
  ::close(fd);
  return connected;
}

}  // namespace

absl::Status PrepareSocketPath(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("--socket is empty");
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", path, "' is longer than ",
                                                   sizeof(sockaddr_un::sun_path) - 1, " bytes"));
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code error;
    std::filesystem::create_directories(parent, error);
    if (error) return PosixError(absl::StrCat("creating ", parent.string()), error.value());
  }
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return PosixError(absl::StrCat("stat ", path), errno);
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", path, "' exists and is not a socket; refusing to replace it"));
  }
  if (SomeoneListens(path)) {
    return absl::FailedPreconditionError(
        absl::StrCat("another server is already listening on ", path));
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return PosixError(absl::StrCat("removing stale socket ", path), errno);
  }
  TIERD_LOG(INFO) << "removed stale socket " << path;
  return absl::OkStatus();
}

absl::StatusOr<gid_t> LookupSocketGroup(const std::string& name) {
  struct group entry;
  struct group* found = nullptr;
  std::vector<char> buffer(16384);
  const int error = ::getgrnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found);
  if (error != 0) return PosixError(absl::StrCat("looking up --socket-group ", name), error);
  if (found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--socket-group: there is no group \"", name, "\""));
  }
  return found->gr_gid;
}

absl::Status CheckMayGiveGroup(gid_t gid, const std::string& name, const std::string& flag) {
  if (::geteuid() == 0 || ::getegid() == gid) return absl::OkStatus();
  const int count = ::getgroups(0, nullptr);
  std::vector<gid_t> groups(count > 0 ? count : 0);
  if (count > 0 && ::getgroups(count, groups.data()) == count &&
      std::find(groups.begin(), groups.end(), gid) != groups.end()) {
    return absl::OkStatus();
  }
  std::string user = absl::StrCat("uid ", ::geteuid());
  struct passwd entry;
  struct passwd* found = nullptr;
  std::vector<char> buffer(16384);
  if (::getpwuid_r(::geteuid(), &entry, buffer.data(), buffer.size(), &found) == 0 &&
      found != nullptr) {
    user = found->pw_name;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": tierd runs as ", user, ", which is not a member of Unix group '", name,
                   "', so it cannot give the group its socket; add it (usermod -aG ", name, " ",
                   user, ") and start tierd again"));
}

absl::Status SetSocketAccess(const std::string& path, std::optional<gid_t> group) {
  if (group.has_value() && ::chown(path.c_str(), static_cast<uid_t>(-1), *group) != 0) {
    return PosixError(absl::StrCat("giving ", path, " group ", *group), errno);
  }
  if (::chmod(path.c_str(), 0660) != 0) return PosixError(absl::StrCat("chmod ", path), errno);
  return absl::OkStatus();
}

}  // namespace tierd
