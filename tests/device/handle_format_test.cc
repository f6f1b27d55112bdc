// The device backends' handles are those proto/tierd/v1/wire.proto's HandleFormats defines (the
// Python client's test_wire_format.py checks its own parsers against the same definition): the
// bytes each kind of handle is made of, and a host backend that writes and opens them so.
#include "device/handle_format.h"

#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "device/host_device.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"
#include "tierd/v1/wire.pb.h"

#ifdef TIERD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tierd {
namespace {

using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;

const v1::HandleFormats& Handles() { return v1::HandleFormats::default_instance(); }

TEST(HandleFormatTest, ACudaSlabHandleIsPrefixSizeThenIpcHandle) {
  const std::string ipc(Handles().cuda_ipc_handle_bytes(), '\x5a');
  const std::string handle = EncodeCudaSlabHandle(0x0102030405060708, ipc);
  EXPECT_EQ(handle, absl::StrCat(Handles().cuda_slab_prefix(),
                                 std::string("\x08\x07\x06\x05\x04\x03\x02\x01", 8), ipc));
  absl::StatusOr<CudaSlabHandle> parsed = ParseCudaSlabHandle(handle);
  ASSERT_THAT(parsed, IsOk());
  EXPECT_EQ(parsed->size, 0x0102030405060708u);
  EXPECT_EQ(parsed->ipc_handle, ipc);
  EXPECT_THAT(ParseCudaSlabHandle(handle.substr(0, handle.size() - 1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseCudaSlabHandle(EncodeCudaEventHandle(std::string(8, '\0') + ipc)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(HandleFormatTest, ACudaEventHandleIsPrefixThenIpcHandle) {
  const std::string ipc(Handles().cuda_ipc_handle_bytes(), '\x11');
  const std::string handle = EncodeCudaEventHandle(ipc);
  EXPECT_EQ(handle, absl::StrCat(Handles().cuda_event_prefix(), ipc));
  EXPECT_EQ(ParseCudaEventHandle(handle).value_or(""), ipc);
  EXPECT_THAT(ParseCudaEventHandle(handle + "x"), StatusIs(absl::StatusCode::kInvalidArgument));
#ifdef TIERD_HAVE_CUDA
  EXPECT_EQ(sizeof(cudaIpcMemHandle_t), CudaIpcHandleBytes());
  EXPECT_EQ(sizeof(cudaIpcEventHandle_t), CudaIpcHandleBytes());
#endif
}

TEST(HandleFormatTest, AHostEventHandleIsPrefixTableSeparatorThenSlot) {
  const std::string handle = EncodeHostEventHandle("/tierd.1.events.0", 17);
  EXPECT_EQ(handle, absl::StrCat(Handles().host_event_prefix(), "/tierd.1.events.0",
                                 Handles().host_event_slot_separator(), "17"));
  absl::StatusOr<HostEventHandle> parsed = ParseHostEventHandle(handle);
  ASSERT_THAT(parsed, IsOk());
  EXPECT_EQ(parsed->table_name, "/tierd.1.events.0");
  EXPECT_EQ(parsed->slot, 17u);
  for (const std::string& wrong :
       {handle.substr(0, handle.size() - 2), handle + "x", Handles().host_event_prefix(),
        absl::StrCat(Handles().host_slab_prefix(), "/tierd.1.events.0:17")}) {
    EXPECT_THAT(ParseHostEventHandle(wrong), StatusIs(absl::StatusCode::kInvalidArgument)) << wrong;
  }
}

TEST(HandleFormatTest, TheHostBackendWritesAndOpensHandlesAsTheProtoDefines) {
  absl::StatusOr<std::unique_ptr<HostDevice>> device = HostDevice::Create();
  ASSERT_THAT(device, IsOk());
  absl::StatusOr<std::unique_ptr<Slab>> slab = (*device)->AllocateSlab(4096);
  ASSERT_THAT(slab, IsOk());
  const std::string& slab_handle = (*slab)->handle();
  ASSERT_EQ(slab_handle.rfind(Handles().host_slab_prefix(), 0), 0u) << slab_handle;
  absl::StatusOr<absl::string_view> name = ParseHostSlabHandle(slab_handle);
  ASSERT_THAT(name, IsOk());
  // A handle spelled from the proto's layout opens the same memory.
  absl::StatusOr<std::unique_ptr<Slab>> opened =
      (*device)->OpenSlab(absl::StrCat(Handles().host_slab_prefix(), *name));
  ASSERT_THAT(opened, IsOk());
  std::memset((*slab)->data(), 0x7e, 4096);
  EXPECT_EQ(static_cast<const unsigned char*>((*opened)->data())[4095], 0x7e);

  absl::StatusOr<std::unique_ptr<Event>> event = (*device)->CreateEvent();
  ASSERT_THAT(event, IsOk());
  absl::StatusOr<HostEventHandle> parsed = ParseHostEventHandle((*event)->handle());
  ASSERT_THAT(parsed, IsOk());
  EXPECT_THAT((*device)->OpenEvent(EncodeHostEventHandle(parsed->table_name, parsed->slot)),
              IsOk());
  // The other kind, or the other backend, is refused before anything is opened.
  EXPECT_THAT((*device)->OpenSlab((*event)->handle()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT((*device)->OpenEvent(slab_handle), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT((*device)->OpenSlab(EncodeCudaSlabHandle(4096, std::string(64, '\0'))),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tierd
