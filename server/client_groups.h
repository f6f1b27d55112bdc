// Client groups (tierd --client-groups): clients that share no GPU staging memory and no stored
// objects with anyone else on the daemon.
//
// A CUDA IPC handle opens a whole staging slab, so every client of one pool can read every object
// staged in it. A client group gets a GPU tier of its own: slabs of its own, handed only to
// sessions on the group's session socket (ClientGroupSocketPathFor), which belongs to the group's
// Unix group with mode 0660, so the kernel decides who is in it. Its stored objects live under a
// key prefix of their own in the shared host cache and durable store: other groups neither see nor
// fetch, evict or overwrite them. Model weights are shared as bytes on disk and in the host cache;
// each group stages its own GPU copies. Clients on the daemon's main sockets form the default
// group.
#ifndef TIERD_SERVER_CLIENT_GROUPS_H_
#define TIERD_SERVER_CLIENT_GROUPS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tierd {

struct ClientGroupOptions {
  std::string name;        // 1-64 characters of [A-Za-z0-9_-]
  std::string unix_group;  // owns the group's session socket
  uint64_t gpu_pool_bytes = 0;
  // What the group's retained sets may hold of its pool; nullopt: half of it.
  std::optional<uint64_t> retain_bytes;
};

// Parses "NAME:UNIXGROUP:BYTES[:RETAIN_BYTES][,...]" (sizes as common/byte_size.h reads them,
// e.g. 4GiB; RETAIN_BYTES at most BYTES); empty: no groups. INVALID_ARGUMENT naming --client-groups and the bad entry
// (malformed, a bad name or size, a name given twice, "default").
absl::StatusOr<std::vector<ClientGroupOptions>> ParseClientGroups(absl::string_view spec);

// The prefix of group `name`'s stored objects in the host cache and the durable store
// (GpuTierOptions::stored_key_prefix). '@' starts no valid key.
std::string ClientGroupKeyPrefix(const std::string& name);

}  // namespace tierd

#endif  // TIERD_SERVER_CLIENT_GROUPS_H_
