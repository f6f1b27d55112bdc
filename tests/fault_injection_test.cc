// Faults injected under a serving daemon: a model file whose reads fail, host <-> GPU copies and
// event records the device refuses. Each gives the request it hits a clear error, frees what the
// request held, and leaves the daemon serving: once the fault is gone the same request succeeds
// with the right bytes. The daemon runs in this process on a device wrapper and a reader hook;
// the client is the C++ client on the daemon's socket.
#include <fcntl.h>
#include <sys/stat.h>

#include <atomic>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/tierd_client.h"
#include "common/status_macros.h"
#include "device/device_wrapper.h"
#include "device/host_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/daemon.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;
using ::tierd::testing::TempDir;

constexpr absl::Duration kTimeout = absl::Seconds(30);

// Fails copies or event records while armed, counting what it failed.
class FaultyDevice : public DeviceWrapper {
 public:
  explicit FaultyDevice(Device& target) : DeviceWrapper(target) {}

  absl::Status CopyAsync(Stream& stream, void* dst, const void* src, size_t bytes) override {
    if (fail_copies) {
      ++faults;
      return absl::InternalError("copy refused (injected)");
    }
    return DeviceWrapper::CopyAsync(stream, dst, src, bytes);
  }
  absl::Status RecordEvent(Event& event, Stream& stream) override {
    if (fail_events) {
      ++faults;
      return absl::InternalError("event record refused (injected)");
    }
    return DeviceWrapper::RecordEvent(event, stream);
  }

  std::atomic<bool> fail_copies{false};
  std::atomic<bool> fail_events{false};
  std::atomic<int> faults{0};
};

class FaultInjectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto host = HostDevice::Create();
    ASSERT_THAT(host, IsOk());
    host_ = *std::move(host);
    model_dir_ = absl::StrCat(dir_.path(), "/model");
    ASSERT_EQ(::mkdir(model_dir_.c_str(), 0755), 0);
    for (int block = 0; block < 4; ++block) {
      tensors_.push_back(testing::RandomTensor(absl::StrCat("blocks.", block, ".w"), "F32",
                                               {256, 256}, 10 + block));
    }
    ASSERT_THAT(testing::WriteSafetensors(absl::StrCat(model_dir_, "/model.safetensors"), tensors_),
                IsOk());

    DaemonOptions options;
    options.socket_path = absl::StrCat(dir_.path(), "/gpu0.sock");
    options.session_socket_path = absl::StrCat(dir_.path(), "/gpu0.session.sock");
    options.state_dir = absl::StrCat(dir_.path(), "/state");
    options.host_cache_bytes = 8 << 20;
    options.gpu_pool_bytes = 2 << 20;
    options.gpu_slab_bytes = 2 << 20;
    options.session_limits.max_leases = 16;
    options.session_limits.max_staging_bytes = 2 << 20;
    options.reader.threads = 1;
    options.reader.queue_depth = 4;
    options.reader.chunk_bytes = 1 << 20;
    options.reader.direct = false;
    // A model file whose reads fail while `fail_reads` is set: opened as a directory, whose
    // reads the kernel refuses (EISDIR), as a disk that returns EIO would.
    options.reader.open_file = [this](const std::string& path, int flags) {
      if (fail_reads && absl::EndsWith(path, ".safetensors")) {
        ++read_faults;
        return ::open(dir_.path().c_str(), O_RDONLY | O_CLOEXEC);
      }
      return ::open(path.c_str(), flags);
    };
    options.create_device = [this]() -> absl::StatusOr<std::unique_ptr<Device>> {
      auto device = std::make_unique<FaultyDevice>(*host_);
      device_ = device.get();
      return device;
    };
    auto daemon = Daemon::Create(options);
    ASSERT_THAT(daemon, IsOk());
    daemon_ = *std::move(daemon);
    ClientOptions client_options;
    client_options.socket_path = options.socket_path;
    auto client = Client::Connect(client_options);
    ASSERT_THAT(client, IsOk());
    client_ = *std::move(client);
    ASSERT_THAT(client_->RegisterModel("m", model_dir_, v1::GROUPING_BLOCK), IsOk());
  }

  void TearDown() override {
    client_.reset();
    if (daemon_ != nullptr) daemon_->Shutdown(absl::ZeroDuration());
  }

  // Waits until the daemon holds nothing for any session and moves nothing.
  void ExpectNothingHeld() {
    const absl::Time deadline = absl::Now() + kTimeout;
    absl::StatusOr<v1::Stats> stats;
    while (absl::Now() < deadline) {
      stats = client_->GetStats();
      if (stats.ok() && stats->leases() == 0 && stats->reservations() == 0 && stats->pins() == 0 &&
          stats->copies_in_flight() == 0 && stats->disk_reads_in_flight() == 0) {
        return;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    ADD_FAILURE() << "still held: "
                  << (stats.ok() ? stats->DebugString() : stats.status().ToString());
  }

  // Fetches block `block` through a new session and checks its bytes.
  absl::Status FetchAndCheck(int block) {
    absl::StatusOr<std::unique_ptr<Session>> session = client_->OpenSession();
    if (!session.ok()) return session.status();
    absl::StatusOr<Lease> lease = (*session)->Fetch(absl::StrCat("m/blocks.", block));
    if (!lease.ok()) return lease.status();
    RETURN_IF_ERROR((*session)->device().SynchronizeStream((*session)->default_stream()));
    const std::string& expected = tensors_[block].data;
    if (lease->size() != expected.size() ||
        std::memcmp(lease->data(), expected.data(), expected.size()) != 0) {
      return absl::DataLossError("wrong bytes");
    }
    lease->Release();
    return absl::OkStatus();
  }

  TempDir dir_;
  std::unique_ptr<HostDevice> host_;
  FaultyDevice* device_ = nullptr;  // owned by the daemon
  std::atomic<bool> fail_reads{false};
  std::atomic<int> read_faults{0};
  std::string model_dir_;
  std::vector<testing::TensorSpec> tensors_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<Client> client_;
};

TEST_F(FaultInjectionTest, AFailingDiskReadFailsTheFetchAndTheNextOneSucceeds) {
  fail_reads = true;
  const absl::Status failed = FetchAndCheck(0);
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.code(), absl::StatusCode::kDataLoss) << "a read error is not corruption";
  EXPECT_THAT(std::string(failed.message()), HasSubstr("model.safetensors")) << failed;
  EXPECT_GE(read_faults, 1);
  ExpectNothingHeld();
  fail_reads = false;
  EXPECT_THAT(FetchAndCheck(0), IsOk());
  EXPECT_THAT(FetchAndCheck(1), IsOk());
  ExpectNothingHeld();
}

TEST_F(FaultInjectionTest, ARefusedCopyFailsTheFetchAndTheNextOneSucceeds) {
  device_->fail_copies = true;
  const absl::Status failed = FetchAndCheck(2);
  EXPECT_FALSE(failed.ok());
  EXPECT_THAT(std::string(failed.message()), HasSubstr("injected")) << failed;
  EXPECT_GE(device_->faults, 1);
  ExpectNothingHeld();
  device_->fail_copies = false;
  EXPECT_THAT(FetchAndCheck(2), IsOk());
  ExpectNothingHeld();
}

TEST_F(FaultInjectionTest, RepeatedCopyFailuresDoNotShrinkThePool) {
  // Twelve failed copies of 256 KiB each: more than the 2 MiB pool, were their ranges lost.
  for (int i = 0; i < 12; ++i) {
    device_->fail_copies = true;
    EXPECT_FALSE(FetchAndCheck(i % 4).ok());
    device_->fail_copies = false;
    // The range comes back once the stream has run what was queued before the failure.
    ExpectNothingHeld();
  }
  // Every block held at once, with the right bytes: the pool has its full size.
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  std::vector<Lease> held;
  for (int block = 0; block < 4; ++block) {
    auto lease = (*session)->Fetch(absl::StrCat("m/blocks.", block));
    ASSERT_THAT(lease, IsOk()) << block;
    held.push_back(*std::move(lease));
  }
  ASSERT_THAT((*session)->device().SynchronizeStream((*session)->default_stream()), IsOk());
  for (int block = 0; block < 4; ++block) {
    EXPECT_EQ(
        std::memcmp(held[block].data(), tensors_[block].data.data(), tensors_[block].data.size()),
        0)
        << block;
  }
  auto stats = client_->GetStats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->gpu().budget_bytes(), 2u << 20);
}

TEST_F(FaultInjectionTest, ARefusedEventRecordFailsTheFetchAndTheNextOneSucceeds) {
  device_->fail_events = true;
  const absl::Status failed = FetchAndCheck(3);
  EXPECT_FALSE(failed.ok());
  EXPECT_THAT(std::string(failed.message()), HasSubstr("injected")) << failed;
  ExpectNothingHeld();
  device_->fail_events = false;
  EXPECT_THAT(FetchAndCheck(3), IsOk());
  EXPECT_THAT(FetchAndCheck(0), IsOk());
  ExpectNothingHeld();
}

TEST_F(FaultInjectionTest, AStoreWhoseCopyIsRefusedFailsAndLeavesNoObject) {
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  std::string bytes(64 << 10, 'z');
  ASSERT_THAT((*session)->device().RegisterHostMemory(bytes.data(), bytes.size()), IsOk());
  device_->fail_copies = true;
  StoreRequest store;
  store.key = "kv/a";
  store.data = bytes.data();
  store.size = bytes.size();
  const absl::Status stored = [&] {
    absl::Status status = (*session)->StoreAsync(store, (*session)->default_stream());
    return status.ok() ? (*session)->Flush() : status;
  }();
  EXPECT_FALSE(stored.ok());
  device_->fail_copies = false;
  // Nothing half-stored is ever served.
  EXPECT_THAT((*session)->Fetch("kv/a"), StatusIs(absl::StatusCode::kNotFound));
  ExpectNothingHeld();
  // The same store works once the device does.
  ASSERT_THAT((*session)->StoreAsync(store, (*session)->default_stream()), IsOk());
  ASSERT_THAT((*session)->Flush(), IsOk());
  auto lease = (*session)->Fetch("kv/a");
  ASSERT_THAT(lease, IsOk());
  ASSERT_THAT((*session)->device().SynchronizeStream((*session)->default_stream()), IsOk());
  EXPECT_EQ(std::memcmp(lease->data(), bytes.data(), bytes.size()), 0);
  lease->Release();
  ASSERT_THAT((*session)->device().UnregisterHostMemory(bytes.data()), IsOk());
}

}  // namespace
}  // namespace tierd
