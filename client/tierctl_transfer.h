// `tierctl get` and `tierctl put`: an object's bytes between a file and the daemon, through a
// session and page-locked host memory (a lease's buffer is device memory in general, so the bytes
// travel by Device::CopyAsync, not memcpy). Only tierctl uses it.
#ifndef TIERD_CLIENT_TIERCTL_TRANSFER_H_
#define TIERD_CLIENT_TIERCTL_TRANSFER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "client/tierd_client.h"

namespace tierd {

// How `tierctl put` stores an object (StoreRequest's flags).
struct PutOptions {
  bool spillable = true;
  bool durable = false;
};

// Fetches `key` and writes its bytes to `path` ("-": stdout). A regular file appears under its
// name only once complete: it is written as a temporary beside it and renamed. A device or FIFO
// that exists at `path` (/dev/null) is written in place, never replaced. Returns the object's size.
// Errors: the daemon's (NOT_FOUND, DATA_LOSS, ...) or the file system's.
absl::StatusOr<uint64_t> GetObjectToFile(Client& client, const std::string& key,
                                         const std::string& path);

// Removes the temporary file a GetObjectToFile still under way writes, if any: for a caller about
// to end the process while it runs (its deadline passed). Async-signal-unsafe; any thread.
void RemoveUnfinishedOutput();

// Stores the bytes of `path` ("-": stdin) as object `key` ("NAMESPACE/NAME"). Returns once the
// daemon has committed it. Returns the object's size.
absl::StatusOr<uint64_t> PutFileAsObject(Client& client, const std::string& key,
                                         const std::string& path, const PutOptions& policy);

}  // namespace tierd

#endif  // TIERD_CLIENT_TIERCTL_TRANSFER_H_
