// A client that half-closes its session (it sends nothing more, as grpcurl does at the end of its
// input) still gets the answers to the requests it sent, on both transports; one that cancels or
// hangs up ends its session at once. The daemon runs in this process with a slow disk (every
// chunk read waits first), so fetches and pins are still in flight when the client half-closes.
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/tierd_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/daemon.h"
#include "testing/fault_injecting_file_system.h"
#include "tests/daemon_test_support.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"
#include "wire/session_socket.h"

namespace tierd {
namespace {

using ::tierd::testing::ConnectUnix;
using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;
using ::tierd::testing::TempDir;

constexpr absl::Duration kTimeout = absl::Seconds(30);
constexpr int kSlowReadMs = 400;

class HalfCloseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string model_dir = absl::StrCat(dir_.path(), "/model");
    ASSERT_EQ(::mkdir(model_dir.c_str(), 0755), 0);
    std::vector<testing::TensorSpec> tensors;
    for (int block = 0; block < 4; ++block) {
      tensors.push_back(testing::RandomTensor(absl::StrCat("blocks.", block, ".w"), "F32",
                                              {256, 256}, 20 + block));
    }
    ASSERT_THAT(testing::WriteSafetensors(absl::StrCat(model_dir, "/model.safetensors"), tensors),
                IsOk());
    DaemonOptions options;
    options.device.kind = DeviceSpec::Kind::kHost;
    options.socket_path = absl::StrCat(dir_.path(), "/gpu0.sock");
    options.session_socket_path = session_socket_path();
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
    // A slow disk: each chunk read (one per 256 KiB block) waits this long first.
    auto file_system = std::make_shared<FaultInjectingFileSystem>();
    file_system->SetFault(FileOperation::kRead, [this](const std::string&) {
      if (const int ms = slow_read_ms.load(); ms > 0) absl::SleepFor(absl::Milliseconds(ms));
      return 0;
    });
    options.file_system = std::move(file_system);
    auto daemon = Daemon::Create(options);
    ASSERT_THAT(daemon, IsOk());
    daemon_ = *std::move(daemon);
    ClientOptions client_options;
    client_options.socket_path = options.socket_path;
    auto client = Client::Connect(client_options);
    ASSERT_THAT(client, IsOk());
    client_ = *std::move(client);
    ASSERT_THAT(client_->RegisterModel("m", model_dir, v1::GROUPING_BLOCK), IsOk());
  }

  void TearDown() override {
    slow_read_ms = 0;
    client_.reset();
    if (daemon_ != nullptr) daemon_->Shutdown(absl::ZeroDuration());
  }

  std::string session_socket_path() const {
    return absl::StrCat(dir_.path(), "/gpu0.session.sock");
  }

  // Waits until no session is open and nothing is leased, pinned or moving.
  void ExpectNoSessionAndNothingHeld(absl::Duration within) {
    const absl::Time deadline = absl::Now() + within;
    absl::StatusOr<v1::Stats> stats;
    while (absl::Now() < deadline) {
      stats = client_->GetStats();
      if (stats.ok() && stats->sessions() == 0 && stats->leases() == 0 && stats->pins() == 0 &&
          stats->copies_in_flight() == 0) {
        return;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    ADD_FAILURE() << "after " << absl::FormatDuration(within) << ", still open or held: "
                  << (stats.ok() ? stats->DebugString() : stats.status().ToString());
  }

  // Checks that `answers` are the fetch (id 2) and the pin (id 3), both granted.
  static void ExpectFetchAndPinGranted(const std::vector<v1::SessionResponse>& answers) {
    ASSERT_EQ(answers.size(), 2u);
    std::set<uint64_t> ids;
    for (const v1::SessionResponse& answer : answers) {
      EXPECT_EQ(answer.code(), 0) << answer.request_id() << ": " << answer.message();
      ids.insert(answer.request_id());
      if (answer.request_id() == 2) {
        EXPECT_TRUE(answer.has_lease());
        EXPECT_EQ(answer.lease().key(), "m/blocks.1");
      }
    }
    EXPECT_EQ(ids, (std::set<uint64_t>{2, 3}));
  }

  // Connects to the session socket, greets, opens a session and checks the answers.
  int OpenOnSessionSocket() {
    const int fd = testing::OpenSessionSocketSession(session_socket_path(), "half_close_test");
    const timeval timeout = absl::ToTimeval(kTimeout);
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    return fd;
  }

  TempDir dir_;
  std::atomic<int> slow_read_ms{0};
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<Client> client_;
};

TEST_F(HalfCloseTest, TheGrpcStreamAnswersWhatIsInFlightWhenTheClientHalfCloses) {
  slow_read_ms = kSlowReadMs;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kTimeout));
  auto stream = client_->stub().Session(&context);
  ASSERT_TRUE(stream->Write(testing::OpenRequest(1, "half_close_test")));
  v1::SessionResponse response;
  ASSERT_TRUE(stream->Read(&response));
  ASSERT_EQ(response.code(), 0) << response.message();
  // Both wait for the slow disk; the client sends nothing more right after them.
  ASSERT_TRUE(stream->Write(testing::FetchRequestFor(2, "m/blocks.1")));
  ASSERT_TRUE(stream->Write(testing::PinRequestFor(3, "m/blocks.2")));
  ASSERT_TRUE(stream->WritesDone());
  std::vector<v1::SessionResponse> answers;
  while (stream->Read(&response)) answers.push_back(response);
  const grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  ExpectFetchAndPinGranted(answers);
  // The session ended with the stream: its lease and pin are released.
  ExpectNoSessionAndNothingHeld(kTimeout);
}

TEST_F(HalfCloseTest, TheSessionSocketAnswersWhatIsInFlightWhenTheClientHalfCloses) {
  slow_read_ms = kSlowReadMs;
  const int fd = OpenOnSessionSocket();
  ASSERT_THAT(SendAll(fd, absl::StrCat(EncodeFrame(testing::FetchRequestFor(2, "m/blocks.1")),
                                       EncodeFrame(testing::PinRequestFor(3, "m/blocks.2")))),
              IsOk());
  ASSERT_EQ(::shutdown(fd, SHUT_WR), 0);
  std::vector<v1::SessionResponse> answers;
  std::string payload;
  absl::Status read;
  while ((read = ReadFrame(fd, payload)).ok()) {
    ASSERT_TRUE(answers.emplace_back().ParseFromString(payload));
  }
  // The daemon closes the connection once everything is answered: a clean end between frames.
  EXPECT_THAT(read, StatusIs(absl::StatusCode::kOutOfRange));
  ::close(fd);
  ExpectFetchAndPinGranted(answers);
  ExpectNoSessionAndNothingHeld(kTimeout);
}

TEST_F(HalfCloseTest, AGrpcStreamCancelledAfterItsHalfCloseEndsItsSessionAtOnce) {
  slow_read_ms = 2500;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kTimeout));
  auto stream = client_->stub().Session(&context);
  ASSERT_TRUE(stream->Write(testing::OpenRequest(1, "half_close_test")));
  v1::SessionResponse response;
  ASSERT_TRUE(stream->Read(&response));
  ASSERT_TRUE(stream->Write(testing::FetchRequestFor(2, "m/blocks.1")));
  ASSERT_TRUE(stream->WritesDone());
  absl::SleepFor(absl::Milliseconds(100));
  context.TryCancel();
  (void)stream->Finish();
  // Well before the read that the fetch waits for is done.
  ExpectNoSessionAndNothingHeld(absl::Seconds(1));
}

TEST_F(HalfCloseTest, ASessionSocketClientThatHangsUpAfterItsHalfCloseEndsItsSessionAtOnce) {
  slow_read_ms = 2500;
  const int fd = OpenOnSessionSocket();
  ASSERT_THAT(SendAll(fd, EncodeFrame(testing::FetchRequestFor(2, "m/blocks.1"))), IsOk());
  ASSERT_EQ(::shutdown(fd, SHUT_WR), 0);
  absl::SleepFor(absl::Milliseconds(100));
  ::close(fd);
  ExpectNoSessionAndNothingHeld(absl::Seconds(1));
}

}  // namespace
}  // namespace tierd
