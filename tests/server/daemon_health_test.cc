// The daemon's health as clients see it over its socket: NOT_SERVING (and UNAVAILABLE calls) while
// it starts, SERVING once the device and the host cache are ready, NOT_SERVING again while the
// device is lost, and the watchdog heartbeat. The daemon runs in this process on a device wrapper
// that can hold up pinning and fail health checks; clients are real gRPC clients on the socket.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/health.h"
#include "device/device_wrapper.h"
#include "device/host_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/daemon.h"
#include "tests/test_support.h"
#include "tierd/v1/tierd.grpc.pb.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOk;
using ::tierd::testing::IsOkAndHolds;
using ::tierd::testing::TempDir;

constexpr absl::Duration kTimeout = absl::Seconds(30);

// Pins only once allowed to; reports itself lost while `lost` is set.
class ControlledDevice : public DeviceWrapper {
 public:
  explicit ControlledDevice(Device& target) : DeviceWrapper(target) {}

  absl::Status RegisterHostMemory(void* data, size_t bytes) override {
    may_pin.WaitForNotification();
    return DeviceWrapper::RegisterHostMemory(data, bytes);
  }
  absl::Status CheckHealth() override {
    ++health_checks;
    if (lost) return absl::UnavailableError("the GPU fell off the bus (simulated)");
    return DeviceWrapper::CheckHealth();
  }

  absl::Notification may_pin;
  std::atomic<bool> lost{false};
  std::atomic<int> health_checks{0};
};

class DaemonHealthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto host = HostDevice::Create();
    ASSERT_THAT(host, IsOk());
    host_ = *std::move(host);
  }

  DaemonOptions Options() {
    DaemonOptions options;
    options.socket_path = absl::StrCat(dir_.path(), "/gpu0.sock");
    options.session_socket_path = "";
    options.state_dir = absl::StrCat(dir_.path(), "/state");
    options.host_cache_bytes = 16 << 20;
    options.gpu_pool_bytes = 16 << 20;
    options.gpu_slab_bytes = 16 << 20;
    options.session_limits.max_leases = 16;
    options.session_limits.max_staging_bytes = 16 << 20;
    options.reader.threads = 1;
    options.reader.queue_depth = 4;
    options.reader.chunk_bytes = 1 << 20;
    options.health_check_period = absl::Milliseconds(50);
    options.create_device = [this]() -> absl::StatusOr<std::unique_ptr<Device>> {
      auto device = std::make_unique<ControlledDevice>(*host_);
      device_ = device.get();
      device_created_.Notify();
      return device;
    };
    return options;
  }

  // The health service's answer, or the error of asking.
  absl::StatusOr<std::string> Health() {
    return CheckHealth(absl::StrCat(dir_.path(), "/gpu0.sock"), absl::Seconds(2));
  }

  // Waits until Health() returns `status`.
  bool AwaitHealth(const std::string& status) {
    const absl::Time deadline = absl::Now() + kTimeout;
    while (absl::Now() < deadline) {
      absl::StatusOr<std::string> health = Health();
      if (health.ok() && *health == status) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  grpc::Status GetStats(v1::Stats* stats) {
    auto channel = grpc::CreateChannel(absl::StrCat("unix:", dir_.path(), "/gpu0.sock"),
                                       grpc::InsecureChannelCredentials());
    auto stub = v1::Tierd::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    return stub->GetStats(&context, v1::GetStatsRequest(), stats);
  }

  TempDir dir_;
  std::unique_ptr<HostDevice> host_;
  ControlledDevice* device_ = nullptr;  // owned by the daemon
  absl::Notification device_created_;   // device_ is set
};

TEST_F(DaemonHealthTest, NotServingWhileStartingThenServing) {
  absl::StatusOr<std::unique_ptr<Daemon>> daemon;
  std::thread starter([&] { daemon = Daemon::Create(Options()); });
  // The socket answers health checks before the daemon is ready...
  ASSERT_TRUE(AwaitHealth("NOT_SERVING"));
  // ...and the API says why it cannot serve yet.
  v1::Stats stats;
  grpc::Status status = GetStats(&stats);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("starting"));
  // The socket answers before the device is made: wait for it, which also orders device_'s write.
  ASSERT_TRUE(device_created_.WaitForNotificationWithTimeout(kTimeout));
  device_->may_pin.Notify();
  starter.join();
  ASSERT_THAT(daemon, IsOk());
  EXPECT_TRUE((*daemon)->serving());
  EXPECT_THAT(Health(), IsOkAndHolds(std::string("SERVING")));
  EXPECT_TRUE(GetStats(&stats).ok());
  EXPECT_EQ(stats.host().budget_bytes(), 16u << 20);
  (*daemon)->Shutdown(absl::ZeroDuration());
}

TEST_F(DaemonHealthTest, NotServingWhileTheDeviceIsLost) {
  std::atomic<int> heartbeats{0};
  DaemonOptions options = Options();
  options.heartbeat = [&] { ++heartbeats; };
  options.metrics_port = 0;  // any free port
  std::thread([this] {
    device_created_.WaitForNotification();
    device_->may_pin.Notify();
  }).detach();
  auto daemon = Daemon::Create(options);
  ASSERT_THAT(daemon, IsOk());
  ASSERT_TRUE(AwaitHealth("SERVING"));
  device_->lost = true;
  ASSERT_TRUE(AwaitHealth("NOT_SERVING"));
  EXPECT_FALSE((*daemon)->serving());
  // The heartbeats go on: a restart cannot bring the GPU back; NOT_SERVING says what is wrong.
  const int before = heartbeats;
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_GT(heartbeats, before);
  device_->lost = false;
  ASSERT_TRUE(AwaitHealth("SERVING"));
  EXPECT_TRUE((*daemon)->serving());
  // Once shutting down it stays NOT_SERVING, whatever the device says.
  (*daemon)->Shutdown(absl::ZeroDuration());
  const int checks = device_->health_checks;
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_GT(device_->health_checks, checks);
  EXPECT_FALSE((*daemon)->serving());
}

TEST_F(DaemonHealthTest, AFailedStartLeavesNoSocket) {
  DaemonOptions options = Options();
  options.create_device = []() -> absl::StatusOr<std::unique_ptr<Device>> {
    return absl::UnavailableError("no GPU today");
  };
  auto daemon = Daemon::Create(options);
  EXPECT_THAT(daemon, ::tierd::testing::StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_NE(::access(options.socket_path.c_str(), F_OK), 0);
  EXPECT_NE(::access(absl::StrCat(options.socket_path, ".starting").c_str(), F_OK), 0);
}

}  // namespace
}  // namespace tierd
