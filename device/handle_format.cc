#include "device/handle_format.h"

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "tierd/v1/wire.pb.h"

namespace tierd {
namespace {

const v1::HandleFormats& Handles() { return v1::HandleFormats::default_instance(); }

constexpr size_t kSizeBytes = sizeof(uint64_t);

}  // namespace

size_t CudaIpcHandleBytes() { return Handles().cuda_ipc_handle_bytes(); }

std::string EncodeCudaSlabHandle(uint64_t size, absl::string_view ipc_handle) {
  std::string handle = Handles().cuda_slab_prefix();
  for (size_t i = 0; i < kSizeBytes; ++i) handle.push_back(static_cast<char>(size >> (8 * i)));
  handle.append(ipc_handle.data(), ipc_handle.size());
  return handle;
}

absl::StatusOr<CudaSlabHandle> ParseCudaSlabHandle(absl::string_view handle) {
  absl::string_view rest = handle;
  if (!absl::ConsumePrefix(&rest, Handles().cuda_slab_prefix()) ||
      rest.size() != kSizeBytes + CudaIpcHandleBytes()) {
    return absl::InvalidArgumentError("not a CUDA slab handle");
  }
  CudaSlabHandle parsed;
  for (size_t i = 0; i < kSizeBytes; ++i) {
    parsed.size |= static_cast<uint64_t>(static_cast<unsigned char>(rest[i])) << (8 * i);
  }
  parsed.ipc_handle = rest.substr(kSizeBytes);
  return parsed;
}

std::string EncodeCudaEventHandle(absl::string_view ipc_handle) {
  return absl::StrCat(Handles().cuda_event_prefix(), ipc_handle);
}

absl::StatusOr<absl::string_view> ParseCudaEventHandle(absl::string_view handle) {
  absl::string_view rest = handle;
  if (!absl::ConsumePrefix(&rest, Handles().cuda_event_prefix()) ||
      rest.size() != CudaIpcHandleBytes()) {
    return absl::InvalidArgumentError("not a CUDA event handle");
  }
  return rest;
}

std::string EncodeHostSlabHandle(absl::string_view shared_memory_name) {
  return absl::StrCat(Handles().host_slab_prefix(), shared_memory_name);
}

absl::StatusOr<absl::string_view> ParseHostSlabHandle(absl::string_view handle) {
  absl::string_view name = handle;
  if (!absl::ConsumePrefix(&name, Handles().host_slab_prefix())) {
    return absl::InvalidArgumentError("not a host slab handle");
  }
  return name;
}

std::string EncodeHostEventHandle(absl::string_view table_name, size_t slot) {
  return absl::StrCat(Handles().host_event_prefix(), table_name,
                      Handles().host_event_slot_separator(), slot);
}

absl::StatusOr<HostEventHandle> ParseHostEventHandle(absl::string_view handle) {
  const absl::string_view prefix = Handles().host_event_prefix();
  const absl::string_view separator = Handles().host_event_slot_separator();
  const size_t at = handle.rfind(separator);
  HostEventHandle parsed;
  if (!absl::StartsWith(handle, prefix) || at == absl::string_view::npos || at < prefix.size() ||
      !absl::SimpleAtoi(handle.substr(at + separator.size()), &parsed.slot)) {
    return absl::InvalidArgumentError("not a host event handle");
  }
  parsed.table_name = handle.substr(prefix.size(), at - prefix.size());
  return parsed;
}

}  // namespace tierd
