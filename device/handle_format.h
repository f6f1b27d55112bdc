// The bytes of each backend's slab and event handles (Handle.handle), as
// proto/tierd/v1/wire.proto's HandleFormats defines them once. The device backends spell and read
// their handles only through here; the Python client reads the same definitions from its generated
// tierd.v1.wire_pb2.
//
// The Parse functions check only a handle's layout; what it names (a shared memory object, an event
// slot) the backend checks. They return INVALID_ARGUMENT, saying which kind of handle `handle` is
// not.
//
// Thread-safe: everything here is a pure function of its arguments.
#ifndef TIERD_DEVICE_HANDLE_FORMAT_H_
#define TIERD_DEVICE_HANDLE_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tierd {

// The size of a CUDA IPC memory or event handle (CU_IPC_HANDLE_SIZE).
size_t CudaIpcHandleBytes();

// A CUDA slab handle: the slab's size and its IPC memory handle's bytes.
struct CudaSlabHandle {
  uint64_t size = 0;
  absl::string_view ipc_handle;  // CudaIpcHandleBytes() bytes, within the parsed handle
};
// REQUIRES: ipc_handle.size() == CudaIpcHandleBytes().
std::string EncodeCudaSlabHandle(uint64_t size, absl::string_view ipc_handle);
absl::StatusOr<CudaSlabHandle> ParseCudaSlabHandle(absl::string_view handle);

// A CUDA event handle carries the IPC event handle's bytes. REQUIRES: as EncodeCudaSlabHandle.
std::string EncodeCudaEventHandle(absl::string_view ipc_handle);
// The IPC event handle's bytes, within `handle`.
absl::StatusOr<absl::string_view> ParseCudaEventHandle(absl::string_view handle);

// A host slab handle names the slab's POSIX shared memory object.
std::string EncodeHostSlabHandle(absl::string_view shared_memory_name);
// The shared memory object's name, within `handle`; not checked further.
absl::StatusOr<absl::string_view> ParseHostSlabHandle(absl::string_view handle);

// A host event handle: the shared memory object holding a table of events, and the slot in it.
struct HostEventHandle {
  absl::string_view table_name;  // within the parsed handle; not checked further
  size_t slot = 0;               // not checked against the table's size
};
std::string EncodeHostEventHandle(absl::string_view table_name, size_t slot);
absl::StatusOr<HostEventHandle> ParseHostEventHandle(absl::string_view handle);

}  // namespace tierd

#endif  // TIERD_DEVICE_HANDLE_FORMAT_H_
