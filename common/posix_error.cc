#include "common/posix_error.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tierd {
namespace {

absl::StatusCode CodeForErrno(int error_number) {
  switch (error_number) {
    case 0:
      return absl::StatusCode::kUnknown;
    case ENOENT:
    case ESRCH:
      return absl::StatusCode::kNotFound;
    case EEXIST:
      return absl::StatusCode::kAlreadyExists;
    case ENOSPC:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case EDQUOT:
      return absl::StatusCode::kResourceExhausted;
    case EINVAL:
    case ENAMETOOLONG:
    case E2BIG:
    case EISDIR:
    case ENOTDIR:
      return absl::StatusCode::kInvalidArgument;
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::StatusCode::kPermissionDenied;
    case EIO:
      return absl::StatusCode::kDataLoss;
    case EAGAIN:
    case EINTR:
    case EBUSY:
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
      return absl::StatusCode::kUnavailable;
    case ENOSYS:
    case EOPNOTSUPP:
      return absl::StatusCode::kUnimplemented;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::Status PosixError(absl::string_view context, int error_number) {
  return absl::Status(CodeForErrno(error_number),
                      absl::StrCat(context, ": ", std::strerror(error_number)));
}

}  // namespace tierd
