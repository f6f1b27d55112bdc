// Faults injected under a serving daemon: a model file whose reads fail, a slow disk, a full disk
// under spills and durable commits (writes go to /dev/full, which fails them with ENOSPC), host <->
// GPU copies and event records the device refuses. Each gives the request it hits a clear error,
// frees what the request held, and leaves the daemon serving: once the fault is gone the same
// request succeeds with the right bytes. The daemon runs in this process on a device wrapper and
// file hooks; the client is the C++ client on the daemon's socket.
#include <fcntl.h>
#include <sys/stat.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/health.h"
#include "client/tierd_client.h"
#include "common/status_macros.h"
#include "device/device_wrapper.h"
#include "device/host_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/daemon.h"
#include "testing/fault_injecting_file_system.h"
#include "tests/daemon_test_support.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"
#include "wire/wire_format.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::tierd::testing::FetchBytes;
using ::tierd::testing::IsOk;
using ::tierd::testing::IsOkAndHolds;
using ::tierd::testing::StatusIs;
using ::tierd::testing::StoreBytes;
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
    truncated_copy_ = absl::StrCat(dir_.path(), "/truncated.safetensors");
    {
      std::ifstream in(absl::StrCat(model_dir_, "/model.safetensors"), std::ios::binary);
      std::string head(64 << 10, '\0');
      in.read(head.data(), head.size());
      std::ofstream(truncated_copy_, std::ios::binary).write(head.data(), head.size());
    }

    DaemonOptions options;
    options.socket_path = absl::StrCat(dir_.path(), "/gpu0.sock");
    options.session_socket_path = absl::StrCat(dir_.path(), "/gpu0.session.sock");
    options.state_dir = absl::StrCat(dir_.path(), "/state");
    options.host_cache_bytes = 8 << 20;
    options.gpu_pool_bytes = 2 << 20;
    options.gpu_slab_bytes = 2 << 20;
    options.session_limits.max_leases = 16;
    options.session_limits.max_staging_bytes = 2 << 20;
    options.session_max_requests = 4;
    options.max_sessions = 6;
    options.reader.threads = 1;
    options.reader.queue_depth = 4;
    options.reader.chunk_bytes = 1 << 20;
    options.reader.direct = false;
    // While `fail_reads` is set, every read of the model file fails (EIO), as a failing disk's
    // would. While `slow_read_ms` is set, every chunk read waits this long first, holding the one
    // reader thread: a slow disk. While `disk_full` is set, every write of a spill file or a
    // durable object fails (ENOSPC). Opens of the model file while `short_reads` is set are
    // counted: those find the file cut short (CutModelFileShort).
    auto file_system = std::make_shared<FaultInjectingFileSystem>();
    file_system->SetFault(FileOperation::kRead, [this](const std::string& path) {
      if (const int ms = slow_read_ms.load(); ms > 0) {
        ++slowed_reads;
        absl::SleepFor(absl::Milliseconds(ms));
      }
      if (fail_reads && absl::EndsWith(path, ".safetensors")) {
        ++read_faults;
        return EIO;
      }
      return 0;
    });
    file_system->SetFault(FileOperation::kOpenForRead, [this](const std::string& path) {
      if (short_reads && absl::EndsWith(path, ".safetensors")) ++short_read_faults;
      return 0;
    });
    file_system->SetFault(FileOperation::kWrite, [this](const std::string& path) {
      if (disk_full && (absl::StrContains(path, "/state/spill/") ||
                        absl::StrContains(path, "/state/durable/"))) {
        ++write_faults;
        return ENOSPC;
      }
      return 0;
    });
    options.file_system = std::move(file_system);
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
    // For docs/RELIABILITY.md (tests/reliability_report.py): what this test injected.
    RecordProperty("faults_read_errors", read_faults.load());
    RecordProperty("faults_short_reads", short_read_faults.load());
    RecordProperty("faults_slowed_reads", slowed_reads.load());
    RecordProperty("faults_full_disk_writes", write_faults.load());
    RecordProperty("faults_refused_device_calls", device_ == nullptr ? 0 : device_->faults.load());
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

  // A store that must survive a restart, and so never spills.
  static StoreRequest Durable() {
    StoreRequest request;
    request.spillable = false;
    request.durable = true;
    return request;
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

  // Puts the first 64 KiB of the model file in its place (its own file kept aside): a file cut
  // short under the daemon. RestoreModelFile puts the original back.
  void CutModelFileShort() {
    const std::string model_file = absl::StrCat(model_dir_, "/model.safetensors");
    ASSERT_EQ(::rename(model_file.c_str(), absl::StrCat(model_file, ".aside").c_str()), 0);
    ASSERT_EQ(::rename(truncated_copy_.c_str(), model_file.c_str()), 0);
    short_reads = true;
  }
  void RestoreModelFile() {
    short_reads = false;
    const std::string model_file = absl::StrCat(model_dir_, "/model.safetensors");
    ASSERT_EQ(::rename(model_file.c_str(), truncated_copy_.c_str()), 0);
    ASSERT_EQ(::rename(absl::StrCat(model_file, ".aside").c_str(), model_file.c_str()), 0);
  }

  TempDir dir_;
  std::unique_ptr<HostDevice> host_;
  FaultyDevice* device_ = nullptr;  // owned by the daemon
  std::atomic<bool> fail_reads{false};
  std::atomic<int> read_faults{0};
  std::atomic<bool> short_reads{false};
  std::atomic<int> short_read_faults{0};
  std::string truncated_copy_;
  std::atomic<int> slow_read_ms{0};
  std::atomic<int> slowed_reads{0};
  std::atomic<bool> disk_full{false};
  std::atomic<int> write_faults{0};
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

TEST_F(FaultInjectionTest, AFileCutShortIsRefusedUntilTheModelIsRegisteredAgain) {
  // Block 3 lies past the first 64 KiB of the file (each block is 256 KiB). The file the reader
  // opens is not the one registered: refused before anything is read from it, never served.
  CutModelFileShort();
  const absl::Status failed = FetchAndCheck(3);
  EXPECT_THAT(failed, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(std::string(failed.message()), HasSubstr("model.safetensors")) << failed;
  EXPECT_GE(short_read_faults, 1);
  ExpectNothingHeld();
  // The model is stale from then on, however the file looks now, until it is registered again.
  RestoreModelFile();
  EXPECT_THAT(FetchAndCheck(3), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(client_->DropModel("m"), IsOk());
  ASSERT_THAT(client_->RegisterModel("m", model_dir_, v1::GROUPING_BLOCK), IsOk());
  EXPECT_THAT(FetchAndCheck(3), IsOk());
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

TEST_F(FaultInjectionTest, ASlowDiskDelaysOnlyTheReadsThatNeedItAndLosesNothing) {
  // Resident before the disk slows down: a stored object and block 0.
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  const std::string stored(64 << 10, 's');
  ASSERT_THAT(StoreBytes(**session, "kv/resident", stored), IsOk());
  ASSERT_THAT(FetchAndCheck(0), IsOk());

  slow_read_ms = 1500;
  absl::Status slow_fetch;
  absl::Time slow_done;
  const absl::Time start = absl::Now();
  std::thread slow([&] {
    slow_fetch = FetchAndCheck(1);
    slow_done = absl::Now();
  });
  // A client whose read is stuck behind the slow disk goes away before it completes: it opens a
  // session, asks for a block and cancels its stream without waiting for the answer.
  std::thread abandoned([&] {
    grpc::ClientContext context;
    auto stream = client_->stub().Session(&context);
    v1::SessionRequest request;
    request.set_request_id(1);
    request.mutable_open()->set_client_name("abandoned");
    request.mutable_open()->set_protocol(SessionProtocolVersion());
    ASSERT_TRUE(stream->Write(request));
    v1::SessionResponse response;
    ASSERT_TRUE(stream->Read(&response));
    ASSERT_EQ(response.code(), 0) << response.message();
    request.Clear();
    request.set_request_id(2);
    request.mutable_fetch()->set_key("m/blocks.2");
    ASSERT_TRUE(stream->Write(request));
    absl::SleepFor(absl::Milliseconds(200));
    context.TryCancel();  // the session ends with its fetch queued behind the slow read
    (void)stream->Finish();
  });
  absl::SleepFor(absl::Milliseconds(100));
  // What is resident is served while the disk crawls.
  const absl::Time fast_start = absl::Now();
  EXPECT_THAT(FetchBytes(**session, "kv/resident"), IsOkAndHolds(stored));
  EXPECT_THAT(FetchAndCheck(0), IsOk());
  EXPECT_LT(absl::Now() - fast_start, absl::Milliseconds(1000));
  auto health = CheckHealth(absl::StrCat(dir_.path(), "/gpu0.sock"), absl::Seconds(5));
  EXPECT_THAT(health, IsOkAndHolds("SERVING"));
  slow.join();
  abandoned.join();
  EXPECT_THAT(slow_fetch, IsOk());  // late, with the right bytes
  EXPECT_GE(slow_done - start, absl::Milliseconds(1500));
  EXPECT_GE(slowed_reads, 1);
  slow_read_ms = 0;
  ExpectNothingHeld();
  EXPECT_THAT(FetchAndCheck(2), IsOk());
  EXPECT_THAT(FetchAndCheck(3), IsOk());
  ExpectNothingHeld();
}

TEST_F(FaultInjectionTest, AFullDiskRefusesSpillsCleanlyAndTheyResumeWhenThereIsRoom) {
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  disk_full = true;
  // 1 MiB objects into an 8 MiB host cache: the ninth needs a spill, which the disk refuses.
  std::vector<std::string> stored;
  absl::Status refused;
  for (int i = 0; i < 16 && refused.ok(); ++i) {
    std::string bytes(1 << 20, '\0');
    testing::FillPattern(bytes.data(), bytes.size(), 300 + i);
    refused = StoreBytes(**session, absl::StrCat("kv/", i), bytes);
    if (refused.ok()) stored.push_back(bytes);
  }
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("host cache full")) << refused;
  EXPECT_GE(write_faults, 1);
  auto stats = client_->GetStats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_GE(stats->spill_failures(), 1u);
  EXPECT_EQ(stats->spills(), 0u);
  ExpectNothingHeld();
  // Everything committed is intact and served.
  ASSERT_FALSE(stored.empty());
  for (size_t i = 0; i < stored.size(); ++i) {
    EXPECT_THAT(FetchBytes(**session, absl::StrCat("kv/", i)), IsOkAndHolds(stored[i])) << i;
  }

  // Room on the disk again: once the failed spills may be retried, stores spill and succeed.
  disk_full = false;
  absl::SleepFor(absl::Milliseconds(1100));
  for (int i = 100; i < 104; ++i) {
    std::string bytes(1 << 20, '\0');
    testing::FillPattern(bytes.data(), bytes.size(), 300 + i);
    ASSERT_THAT(StoreBytes(**session, absl::StrCat("kv/", i), bytes), IsOk()) << i;
  }
  stats = client_->GetStats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_GE(stats->spills(), 1u);
  // Spilled ones come back from disk with their bytes.
  for (size_t i = 0; i < stored.size(); ++i) {
    EXPECT_THAT(FetchBytes(**session, absl::StrCat("kv/", i)), IsOkAndHolds(stored[i])) << i;
  }
  ExpectNothingHeld();
}

TEST_F(FaultInjectionTest, AFullDiskRefusesADurableCommitAndKeepsThePreviousVersion) {
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  const std::string first(96 << 10, '1');
  const std::string second(96 << 10, '2');
  ASSERT_THAT(StoreBytes(**session, "kv/durable", first, Durable()), IsOk());
  disk_full = true;
  const absl::Status refused = StoreBytes(**session, "kv/durable", second, Durable());
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("durable")) << refused;
  // The previous version stays, in memory and on disk; no unfinished file is left.
  EXPECT_THAT(FetchBytes(**session, "kv/durable"), IsOkAndHolds(first));
  auto stats = client_->GetStats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->durable_write_failures(), 1u);
  EXPECT_EQ(stats->durable_objects(), 1u);
  for (const auto& file :
       std::filesystem::directory_iterator(absl::StrCat(dir_.path(), "/state/durable"))) {
    EXPECT_TRUE(absl::EndsWith(file.path().string(), ".tdo")) << file.path();
  }
  ExpectNothingHeld();
  disk_full = false;
  ASSERT_THAT(StoreBytes(**session, "kv/durable", second, Durable()), IsOk());
  EXPECT_THAT(FetchBytes(**session, "kv/durable"), IsOkAndHolds(second));
  ExpectNothingHeld();
}

TEST_F(FaultInjectionTest, SessionsAndRequestsInFlightAreBounded) {
  // Six sessions may be open at once (the fixture's max_sessions); a seventh is refused.
  std::vector<std::unique_ptr<Session>> open;
  for (int i = 0; i < 6; ++i) {
    auto session = client_->OpenSession();
    ASSERT_THAT(session, IsOk()) << i;
    open.push_back(*std::move(session));
  }
  auto refused = client_->OpenSession();
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--max-sessions"));
  // A session that ends makes room for another.
  open.pop_back();
  absl::StatusOr<std::unique_ptr<Session>> another;
  const absl::Time deadline = absl::Now() + kTimeout;
  do {
    another = client_->OpenSession();
  } while (!another.ok() && absl::Now() < deadline);
  ASSERT_THAT(another, IsOk());
  another->reset();
  open.clear();

  // With the disk slowed down, fetches wait in flight: four may, in one session; the fifth and
  // sixth are refused at once, and the four are answered with leases once read.
  slow_read_ms = 300;
  grpc::ClientContext context;
  auto stream = client_->stub().Session(&context);
  v1::SessionRequest request;
  request.set_request_id(1);
  request.mutable_open()->set_client_name("pipelining");
  request.mutable_open()->set_protocol(SessionProtocolVersion());
  ASSERT_TRUE(stream->Write(request));
  v1::SessionResponse response;
  ASSERT_TRUE(stream->Read(&response));
  ASSERT_EQ(response.code(), 0) << response.message();
  for (int i = 0; i < 6; ++i) {
    request.Clear();
    request.set_request_id(10 + i);
    request.mutable_fetch()->set_key(absl::StrCat("m/blocks.", i % 4));
    ASSERT_TRUE(stream->Write(request));
  }
  std::vector<uint64_t> leases;
  int too_many = 0;
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(stream->Read(&response));
    if (response.code() == 0) {
      leases.push_back(response.lease().lease_id());
    } else {
      EXPECT_EQ(response.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
      EXPECT_THAT(response.message(), HasSubstr("requests in flight"));
      ++too_many;
    }
  }
  EXPECT_EQ(leases.size(), 4u);
  EXPECT_EQ(too_many, 2);
  slow_read_ms = 0;
  for (uint64_t lease : leases) {
    request.Clear();
    request.set_request_id(100 + lease);
    request.mutable_release()->set_lease_id(lease);
    ASSERT_TRUE(stream->Write(request));
    ASSERT_TRUE(stream->Read(&response));
    EXPECT_EQ(response.code(), 0) << response.message();
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  ExpectNothingHeld();
}

}  // namespace
}  // namespace tierd
