// Open-file-description locks on single bytes of a file (fcntl F_OFD_SETLK): shared by the
// threads and processes that open the file, each opening it anew, and released when the holder's
// description is closed or the holder dies — so a crashed process never keeps one.
//
// A wait for a held byte is bounded: F_OFD_SETLKW cannot be interrupted short of a signal, so the
// lock is tried again at intervals growing from half a millisecond to 20 ms until it is taken, the
// deadline passes or the caller says to stop.
#ifndef TIERD_COMMON_BYTE_LOCK_H_
#define TIERD_COMMON_BYTE_LOCK_H_

#include <sys/types.h>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tierd {

// Tries once to write-lock byte `offset` of `fd`: true when taken, false when another
// description holds it; I/O errors otherwise.
absl::StatusOr<bool> TryLockByte(int fd, off_t offset);

// Write-locks byte `offset` of `fd`, waiting while another description holds it. Errors:
// DEADLINE_EXCEEDED past `deadline`, CANCELLED once `stopped` returns true, I/O errors (EBADF,
// ENOLCK, ...) as PosixError gives them.
absl::Status LockByte(int fd, off_t offset, absl::Time deadline, absl::FunctionRef<bool()> stopped);

}  // namespace tierd

#endif  // TIERD_COMMON_BYTE_LOCK_H_
