// errno → absl::Status, in exactly one place.
#ifndef TIERD_COMMON_POSIX_ERROR_H_
#define TIERD_COMMON_POSIX_ERROR_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tierd {

// Maps `error_number` to the status code a caller should act on (ENOENT → NOT_FOUND, ENOSPC and
// ENOMEM → RESOURCE_EXHAUSTED, EINVAL → INVALID_ARGUMENT, EIO → DATA_LOSS, EAGAIN/EINTR →
// UNAVAILABLE, EACCES/EPERM → PERMISSION_DENIED, …) with a message "context: strerror".
absl::Status PosixError(absl::string_view context, int error_number);

}  // namespace tierd

#endif  // TIERD_COMMON_POSIX_ERROR_H_
