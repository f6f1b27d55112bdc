// StorageStack: builds every tier over one file system, hands the durable store's recovered
// objects back, and fails cleanly on bad options.
#include "storage/storage_stack.h"

#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "device/host_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fault_injecting_file_system.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;
using ::tierd::testing::TempDir;

class StorageStackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = HostDevice::Create();
    ASSERT_THAT(device, IsOk());
    device_ = *std::move(device);
    options_.state_dir = absl::StrCat(dir_.path(), "/state");
    options_.arena = {1 << 20, 1 << 20};
    options_.reader.threads = 1;
    options_.reader.queue_depth = 2;
    options_.reader.chunk_bytes = 64 << 10;
    options_.file_system = file_system_;
  }

  // Persists `bytes` as `key` through the stack's durable store and waits for the answer.
  static absl::Status Persist(StorageStack& stack, const std::string& key,
                              const std::string& bytes) {
    absl::Notification done;
    absl::Status result;
    stack.durable()->Persist(key, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), {},
                             [&](absl::StatusOr<DurableRecord> record) {
                               result = record.status();
                               done.Notify();
                             });
    done.WaitForNotification();
    return result;
  }

  TempDir dir_;
  std::unique_ptr<HostDevice> device_;
  std::shared_ptr<FaultInjectingFileSystem> file_system_ =
      std::make_shared<FaultInjectingFileSystem>();
  StorageStackOptions options_;
};

TEST_F(StorageStackTest, DurableObjectsComeBackWhenTheStackIsBuiltAgain) {
  {
    auto stack = StorageStack::Create(*device_, options_);
    ASSERT_THAT(stack, IsOk());
    ASSERT_NE((*stack)->durable(), nullptr);
    EXPECT_EQ((*stack)->catalog().model_count(), 0u);
    EXPECT_EQ((*stack)->spill().directory(), absl::StrCat(options_.state_dir, "/spill"));
    ASSERT_THAT(Persist(**stack, "kv/a", "bytes"), IsOk());
  }
  std::vector<DurableRecord> recovered;
  auto stack = StorageStack::Create(*device_, options_, &recovered);
  ASSERT_THAT(stack, IsOk());
  ASSERT_EQ(recovered.size(), 1u);
  EXPECT_EQ(recovered[0].key, "kv/a");
}

TEST_F(StorageStackTest, EveryTierWritesThroughTheGivenFileSystem) {
  auto stack = StorageStack::Create(*device_, options_);
  ASSERT_THAT(stack, IsOk());
  file_system_->FailAlways(FileOperation::kWrite, "/durable/", ENOSPC);
  EXPECT_THAT(Persist(**stack, "kv/a", "bytes"), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(file_system_->failures(FileOperation::kWrite), 1u);
}

TEST_F(StorageStackTest, WithoutADurableStoreThereIsNone) {
  options_.durable_store = false;
  std::vector<DurableRecord> recovered(3);
  auto stack = StorageStack::Create(*device_, options_, &recovered);
  ASSERT_THAT(stack, IsOk());
  EXPECT_EQ((*stack)->durable(), nullptr);
  EXPECT_TRUE(recovered.empty());
}

TEST_F(StorageStackTest, BadOptionsFailTheBuild) {
  options_.reader.threads = 0;
  EXPECT_THAT(StorageStack::Create(*device_, options_),
              StatusIs(absl::StatusCode::kInvalidArgument));
  options_.reader.threads = 1;
  options_.state_dir.clear();
  EXPECT_THAT(StorageStack::Create(*device_, options_),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tierd
