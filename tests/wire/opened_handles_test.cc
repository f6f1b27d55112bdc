// The handles a daemon sends a session, opened on the client's side: a HOST_ARENA handle becomes
// a PeerArena that OpenedHandles and SessionCore hand out by id.
#include "wire/detail/opened_handles.h"

#include <unistd.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "device/host_device.h"
#include "device/pinned_host_buffer.h"
#include "device/shared_memory.h"
#include "gtest/gtest.h"
#include "tests/registration_recording_device.h"
#include "tests/test_support.h"
#include "wire/peer_arena.h"
#include "wire/session_core.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOk;
using ::tierd::testing::RegistrationRecordingDevice;
using ::tierd::testing::StatusIs;

constexpr uint64_t kMiB = 1 << 20;

// A transport with nothing to say: Read waits until the writes are closed, then ends cleanly.
class SilentTransport : public SessionTransport {
 public:
  bool Write(const v1::SessionRequest&) override { return true; }
  bool Read(v1::SessionResponse&) override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&closed_));
    return false;
  }
  void CloseWrites() override {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  void Abort() override { CloseWrites(); }
  absl::Status Finish() override { return absl::OkStatus(); }
  const char* kind() const override { return "silent"; }

 private:
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

class OpenedHostArenaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto host = HostDevice::Create();
    ASSERT_THAT(host, IsOk());
    host_ = *std::move(host);
    device_ = std::make_shared<RegistrationRecordingDevice>(*host_);
    // The home daemon's arena, as far as the peer can tell: a shared memory object by name.
    auto home = SharedMemory::Create(
        absl::StrCat(SharedMemoryPrefixForPid(::getpid()), "opened-handles-arena"), 4 * kMiB);
    ASSERT_THAT(home, IsOk());
    home_ = *std::move(home);
  }

  v1::SessionResponse ResponseWithArena(uint32_t id, const std::string& name) const {
    v1::SessionResponse response;
    v1::Handle* handle = response.add_new_handles();
    handle->set_kind(v1::Handle::HOST_ARENA);
    handle->set_id(id);
    handle->set_handle(name);
    handle->set_size(home_->size());
    handle->set_piece_bytes(kMiB);
    return response;
  }

  std::unique_ptr<HostDevice> host_;
  std::shared_ptr<RegistrationRecordingDevice> device_;
  std::unique_ptr<SharedMemory> home_;
};

TEST_F(OpenedHostArenaTest, AHostArenaHandleIsOpenedAsAPeerArena) {
  detail::OpenedHandles handles;
  const v1::SessionResponse response = ResponseWithArena(3, home_->name());
  ASSERT_THAT(handles.Open(response, device_), IsOk());
  absl::StatusOr<PeerArena*> arena = handles.host_arena(3);
  ASSERT_THAT(arena, IsOk());
  EXPECT_EQ((*arena)->size(), 4 * kMiB);
  EXPECT_EQ((*arena)->piece_bytes(), kMiB);
  EXPECT_TRUE(device_->registered().empty());  // nothing is registered until it is used

  static_cast<uint8_t*>(home_->data())[kMiB + 7] = 42;
  ASSERT_THAT((*arena)->EnsureRegistered(kMiB, 8), IsOk());
  EXPECT_EQ((*arena)->data()[kMiB + 7], 42);
  EXPECT_EQ(device_->read_only_registered().size(), 1u);

  // The same handle again is not opened again: the arena and its registrations stay.
  ASSERT_THAT(handles.Open(response, device_), IsOk());
  EXPECT_EQ(*handles.host_arena(3), *arena);
  EXPECT_EQ((*arena)->registered_pieces(), 1u);
  EXPECT_THAT(handles.host_arena(4), StatusIs(absl::StatusCode::kInternal));
  EXPECT_THAT(handles.host_buffer(3), StatusIs(absl::StatusCode::kInternal));
}

TEST_F(OpenedHostArenaTest, AnArenaThatCannotBeOpenedFailsAloneAndIsNamed) {
  detail::OpenedHandles handles;
  v1::SessionResponse response = ResponseWithArena(5, home_->name() + "-gone");
  *response.add_new_handles() = ResponseWithArena(6, home_->name()).new_handles(0);
  absl::Status opened = handles.Open(response, device_);
  EXPECT_THAT(opened, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_NE(opened.message().find("host arena 5"), absl::string_view::npos) << opened;
  EXPECT_THAT(handles.host_arena(5), StatusIs(absl::StatusCode::kInternal));
  EXPECT_THAT(handles.host_arena(6), IsOk());
}

TEST_F(OpenedHostArenaTest, SessionCoreHandsOutTheArenasItOpened) {
  std::shared_ptr<SessionCore> core = SessionCore::Start(std::make_unique<SilentTransport>());
  core->set_device(device_);
  ASSERT_THAT(core->OpenHandles(ResponseWithArena(9, home_->name())), IsOk());
  absl::StatusOr<PeerArena*> arena = core->host_arena(9);
  ASSERT_THAT(arena, IsOk());
  EXPECT_EQ((*arena)->size(), home_->size());
  ASSERT_THAT((*arena)->EnsureRegistered(0, 4 * kMiB), IsOk());
  EXPECT_EQ((*arena)->registered_pieces(), 4u);
  EXPECT_THAT(core->host_arena(10), StatusIs(absl::StatusCode::kInternal));
  core.reset();
  EXPECT_EQ(device_->unregistered(), device_->registered());
}

}  // namespace
}  // namespace tierd
