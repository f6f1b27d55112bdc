// The tierd.v1 API end to end: a real daemon process on the backend under test (api_test_host,
// api_test_cuda), clients in this process and in peer processes (api_peer), real files.
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/tierd_client.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/daemon_test_support.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"
#include "wire/session_socket.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::tierd::testing::ConnectUnix;
using ::tierd::testing::IsOk;
using ::tierd::testing::RandomTensor;
using ::tierd::testing::RunProgram;
using ::tierd::testing::SiblingBinary;
using ::tierd::testing::StatusIs;
using ::tierd::testing::StoreBytes;
using ::tierd::testing::Subprocess;
using ::tierd::testing::TempDir;
using ::tierd::testing::TensorSpec;

constexpr absl::Duration kTimeout = absl::Seconds(60);
constexpr int kBlocks = 8;
// Two 256 KiB tensors per block: 512 KiB objects; the 2 MiB pool holds four.
constexpr uint64_t kRows = 64;
constexpr uint64_t kCols = 1024;

class ApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_THAT(WriteModel("model", /*seed=*/1), IsOk());
    daemon_ = StartDaemon();
    ASSERT_NE(daemon_, nullptr);
    ClientOptions options;
    options.socket_path = socket_path();
    options.client_name = "api_test";
    auto client = Client::Connect(options);
    ASSERT_THAT(client, IsOk());
    client_ = *std::move(client);
    auto summary = client_->RegisterModel("m", model_dir("model"), v1::GROUPING_BLOCK);
    ASSERT_THAT(summary, IsOk());
    ASSERT_EQ(summary->objects(), static_cast<uint32_t>(kBlocks));
  }

  void TearDown() override {
    client_.reset();
    if (daemon_ != nullptr) {
      daemon_->Signal(SIGTERM);
      EXPECT_THAT(daemon_->Wait(kTimeout), ::tierd::testing::IsOkAndHolds(0));
    }
  }

  std::string socket_path() const { return absl::StrCat(dir_.path(), "/gpu0.sock"); }
  std::string model_dir(const std::string& name) const {
    return absl::StrCat(dir_.path(), "/", name);
  }
  std::string expected_dir() const { return absl::StrCat(dir_.path(), "/expected"); }
  static std::string Key(int block) { return absl::StrCat("m/blocks.", block); }

  // Writes a model of kBlocks blocks with random contents, and each tensor's bytes to
  // expected_dir()/<tensor name>.
  absl::Status WriteModel(const std::string& name, uint64_t seed) {
    std::vector<TensorSpec> tensors;
    for (int block = 0; block < kBlocks; ++block) {
      for (const char* part : {"attn.qkv.weight", "ffn.up.weight"}) {
        tensors.push_back(RandomTensor(absl::StrCat("blocks.", block, ".", part), "F32",
                                       {kRows, kCols}, seed * 1000 + tensors.size()));
      }
    }
    ::mkdir(model_dir(name).c_str(), 0755);
    ::mkdir(expected_dir().c_str(), 0755);
    for (const TensorSpec& tensor : tensors) {
      RETURN_IF_ERROR(
          testing::WriteFile(absl::StrCat(expected_dir(), "/", tensor.name), tensor.data));
      expected_[tensor.name] = tensor.data;
    }
    return testing::WriteSafetensors(absl::StrCat(model_dir(name), "/model.safetensors"), tensors);
  }

  std::vector<std::string> TierdArgs() const {
    return {SiblingBinary("tierd"),
            absl::StrCat("--device=", testing::DeviceUnderTest().ToString()),
            absl::StrCat("--socket=", socket_path()),
            absl::StrCat("--state-dir=", dir_.path(), "/state"),
            "--host-cache-bytes=16MiB",
            "--gpu-pool-bytes=2MiB",
            "--gpu-slab-bytes=1MiB",
            "--session-max-leases=3",
            "--shutdown-grace-ms=2000"};
  }

  std::unique_ptr<Subprocess> StartDaemon() {
    auto daemon = testing::StartServingDaemon(TierdArgs(), socket_path(), kTimeout);
    EXPECT_THAT(daemon, IsOk());
    return daemon.ok() ? *std::move(daemon) : nullptr;
  }

  std::unique_ptr<Subprocess> StartPeer(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {SiblingBinary("api_peer"), args[0], socket_path()};
    argv.insert(argv.end(), args.begin() + 1, args.end());
    auto peer = Subprocess::Start(argv);
    EXPECT_THAT(peer, IsOk());
    return peer.ok() ? *std::move(peer) : nullptr;
  }

  // The lease's bytes, copied out through the session's stream.
  static std::string Bytes(Session& session, const Lease& lease) {
    std::string copy(lease.size(), '\0');
    EXPECT_THAT(session.device().CopyAsync(session.default_stream(), copy.data(), lease.data(),
                                           lease.size()),
                IsOk());
    EXPECT_THAT(session.device().SynchronizeStream(session.default_stream()), IsOk());
    return copy;
  }

  void ExpectTensorsMatch(Session& session, const Lease& lease) {
    const std::string bytes = Bytes(session, lease);
    ASSERT_EQ(lease.tensors().size(), 2u);
    for (const v1::TensorInfo& tensor : lease.tensors()) {
      EXPECT_EQ(bytes.compare(tensor.offset(), tensor.size(), expected_[tensor.name()]), 0)
          << tensor.name();
    }
  }

  v1::Stats Stats() {
    auto stats = client_->GetStats();
    EXPECT_THAT(stats, IsOk());
    return stats.ok() ? *stats : v1::Stats();
  }

  // Runs tierctl against the daemon with `args`.
  testing::RunResult Tierctl(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {SiblingBinary("tierctl"),
                                     absl::StrCat("--socket=", socket_path())};
    argv.insert(argv.end(), args.begin(), args.end());
    auto result = RunProgram(argv, kTimeout);
    EXPECT_THAT(result, IsOk());
    return result.ok() ? *result : testing::RunResult{};
  }

  // Polls GetStats until `done` holds or `timeout` passes.
  bool WaitForStats(const std::function<bool(const v1::Stats&)>& done, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      if (done(Stats())) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  TempDir dir_;
  std::map<std::string, std::string> expected_;
  std::unique_ptr<Subprocess> daemon_;
  std::unique_ptr<Client> client_;
};

TEST_F(ApiTest, EveryObjectFetchedByConcurrentClientsEqualsTheFileBytes) {
  std::vector<std::unique_ptr<Subprocess>> peers;
  for (int i = 0; i < 3; ++i) peers.push_back(StartPeer({"verify", "m", expected_dir(), "3"}));
  for (auto& peer : peers) {
    ASSERT_NE(peer, nullptr);
    EXPECT_THAT(peer->Wait(kTimeout), ::tierd::testing::IsOkAndHolds(0));
  }
  // The pool holds four of the eight objects: the clients forced evictions all along.
  EXPECT_GT(Stats().gpu().evictions(), 0u);
}

TEST_F(ApiTest, PrefetchThenFetchUsesTheCopyAlreadyOnTheGpu) {
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  ASSERT_THAT((*session)->Prefetch({Key(2)}), IsOk());
  // Resident once the copy is enqueued; ListObjects says so.
  const absl::Time deadline = absl::Now() + kTimeout;
  bool on_gpu = false;
  while (!on_gpu && absl::Now() < deadline) {
    auto objects = client_->ListObjects("m");
    ASSERT_THAT(objects, IsOk());
    for (const v1::ObjectInfo& object : *objects)
      on_gpu |= object.key() == Key(2) && object.on_gpu();
    if (!on_gpu) absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(on_gpu);
  const uint64_t hits = Stats().gpu().hits();
  auto lease = (*session)->Fetch(Key(2));
  ASSERT_THAT(lease, IsOk());
  ExpectTensorsMatch(**session, *lease);
  EXPECT_EQ(Stats().gpu().hits(), hits + 1);
}

TEST_F(ApiTest, ThreadsFetchThroughOneSessionAtOnce) {
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  // Each thread holds one lease at a time on a stream of its own: three at once, the quota.
  std::vector<std::thread> threads;
  std::vector<std::string> failures(3);
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      auto stream = (*session)->device().CreateStream(StreamPriority::kNormal);
      if (!stream.ok()) return void(failures[t] = stream.status().ToString());
      for (int round = 0; round < 4; ++round) {
        const int block = (t + round) % kBlocks;
        auto lease = (*session)->Fetch(Key(block), **stream);
        if (!lease.ok()) return void(failures[t] = lease.status().ToString());
        std::string bytes(lease->size(), '\0');
        absl::Status copied =
            (*session)->device().CopyAsync(**stream, bytes.data(), lease->data(), lease->size());
        if (copied.ok()) copied = (*session)->device().SynchronizeStream(**stream);
        if (!copied.ok()) return void(failures[t] = copied.ToString());
        for (const v1::TensorInfo& tensor : lease->tensors()) {
          if (bytes.compare(tensor.offset(), tensor.size(), expected_[tensor.name()]) != 0) {
            return void(failures[t] = absl::StrCat(tensor.name(), " differs"));
          }
        }
        lease->Release(**stream);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::string& failure : failures) EXPECT_EQ(failure, "");
}

TEST_F(ApiTest, StoredObjectComesBackAfterLeavingTheGpuAndTheHostTier) {
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  std::string bytes(300 * 1024, '\0');
  testing::FillPattern(bytes.data(), bytes.size(), 42);
  StoreRequest store;
  v1::TensorInfo tensor;
  tensor.set_name("kv");
  tensor.set_dtype("U8");
  tensor.add_shape(bytes.size());
  tensor.set_size(bytes.size());
  store.tensors.push_back(tensor);
  const std::string key = "acts/s_kv_cond_12";
  ASSERT_THAT(StoreBytes(**session, key, bytes, store), IsOk());

  for (v1::Tier tier : {v1::TIER_GPU, v1::TIER_HOST}) {
    // The last fetch's copy and release finish after its bytes are read; until then the object
    // is in flight and cannot be evicted.
    ASSERT_TRUE(WaitForStats(
        [](const v1::Stats& s) { return s.leases() == 0 && s.copies_in_flight() == 0; }, kTimeout));
    auto evicted = client_->Evict(key, tier);
    ASSERT_THAT(evicted, IsOk());
    EXPECT_EQ(evicted->evicted(), 1u) << v1::Tier_Name(tier);
    auto lease = (*session)->Fetch(key);
    ASSERT_THAT(lease, IsOk());
    EXPECT_EQ(Bytes(**session, *lease), bytes) << "after eviction from " << v1::Tier_Name(tier);
    ASSERT_EQ(lease->tensors().size(), 1u);
    EXPECT_EQ(lease->tensors()[0].name(), "kv");
  }
  EXPECT_GE(Stats().spilled_objects() + Stats().stored_objects(), 1u);
  ASSERT_THAT(client_->Evict(key, v1::TIER_ALL), IsOk());
  EXPECT_THAT((*session)->Fetch(key), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(ApiTest, AStoreTheHostTierCannotHoldFailsWithResourceExhaustedAndLosesNothingElse) {
  // Objects stored unspillable cannot leave the 16 MiB host tier: the commits of 1 MiB objects
  // fill it, then fail.
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  std::vector<std::string> stored;
  absl::Status failure;
  for (int i = 0; i < 24 && failure.ok(); ++i) {
    std::string bytes(1 << 20, '\0');
    testing::FillPattern(bytes.data(), bytes.size(), 100 + i);
    StoreRequest store;
    store.key = absl::StrCat("acts/full_", i);
    store.data = bytes.data();
    store.size = bytes.size();
    store.spillable = false;
    ASSERT_THAT((*session)->StoreAsync(store), IsOk());
    failure = (*session)->Flush();
    // `bytes` must outlive the copy from it; only a successful commit waits for that.
    ASSERT_THAT((*session)->device().SynchronizeStream((*session)->default_stream()), IsOk());
    if (failure.ok()) stored.push_back(store.key);
  }
  EXPECT_THAT(failure, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(failure.message()), HasSubstr("host cache full"));
  // tierctl put reports the refused commit too.
  const std::string file = absl::StrCat(dir_.path(), "/one-more");
  ASSERT_THAT(testing::WriteFile(file, std::string(1 << 20, 'p')), IsOk());
  auto put = RunProgram({"/bin/sh", "-c",
                         absl::StrCat(SiblingBinary("tierctl"), " --socket=", socket_path(),
                                      " put acts/one_more ", file, " --no-spill 2>&1")},
                        kTimeout);
  ASSERT_THAT(put, IsOk());
  EXPECT_EQ(put->exit_code, 1) << put->output;
  EXPECT_THAT(put->output, HasSubstr("RESOURCE_EXHAUSTED"));
  ASSERT_FALSE(stored.empty());
  // What was committed before is intact.
  for (size_t i = 0; i < stored.size(); ++i) {
    std::string expected(1 << 20, '\0');
    testing::FillPattern(expected.data(), expected.size(), 100 + i);
    ASSERT_THAT(client_->Evict(stored[i], v1::TIER_GPU), IsOk());
    auto lease = (*session)->Fetch(stored[i]);
    ASSERT_THAT(lease, IsOk());
    EXPECT_EQ(Bytes(**session, *lease), expected) << stored[i];
  }
}

TEST_F(ApiTest, AReadStillRunningAfterItsReleaseSeesTheBytesItWasLeased) {
  // A client process releases block 0 right after enqueuing a read of it that starts 1.5 s later
  // (on CUDA a kernel waiting on the GPU). Meanwhile the pool fills: blocks 1-3 are held here, so
  // block 4 can only go where block 0 is. The daemon must wait for the done event before it
  // copies block 4 over it.
  constexpr absl::Duration kReadDelay = absl::Milliseconds(1500);
  auto holding = client_->OpenSession();
  ASSERT_THAT(holding, IsOk());
  std::vector<Lease> held;
  for (int block = 1; block <= 3; ++block) {
    auto lease = (*holding)->Fetch(Key(block));
    ASSERT_THAT(lease, IsOk());
    held.push_back(*std::move(lease));
  }
  auto reader = StartPeer(
      {"slow-read", Key(0), expected_dir(), absl::StrCat(absl::ToInt64Milliseconds(kReadDelay))});
  ASSERT_NE(reader, nullptr);
  ASSERT_THAT(reader->ReadLine(kTimeout), ::tierd::testing::IsOkAndHolds(std::string("released")));
  const absl::Time released = absl::Now();
  auto other = client_->OpenSession();
  ASSERT_THAT(other, IsOk());
  auto fourth = (*other)->Fetch(Key(4));
  ASSERT_THAT(fourth, IsOk());
  // The fetch waited for the slow read (with slack for the time between launch and "released").
  EXPECT_GE(absl::Now() - released, kReadDelay - absl::Milliseconds(500));
  ExpectTensorsMatch(**other, *fourth);
  // The peer compared what its read saw with block 0's bytes.
  EXPECT_THAT(reader->Wait(kTimeout), ::tierd::testing::IsOkAndHolds(0));
  // Block 4 did take block 0's place: the test exercised the reuse it guards.
  auto objects = client_->ListObjects("m");
  ASSERT_THAT(objects, IsOk());
  for (const v1::ObjectInfo& object : *objects) {
    if (object.key() == Key(0)) {
      EXPECT_FALSE(object.on_gpu());
    }
  }
}

TEST_F(ApiTest, TwoClientProcessesShareOneGpuCopy) {
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  auto lease = (*session)->Fetch(Key(2));
  ASSERT_THAT(lease, IsOk());
  // Copies are counted when they complete.
  ASSERT_TRUE(WaitForStats([](const v1::Stats& s) { return s.copies_in_flight() == 0; }, kTimeout));
  const v1::Stats before = Stats();
  // Another process fetches the same key while this one holds it, and checks the bytes.
  auto peer = StartPeer({"hold", Key(2), expected_dir(), "1"});
  ASSERT_NE(peer, nullptr);
  EXPECT_THAT(peer->Wait(kTimeout), ::tierd::testing::IsOkAndHolds(0));
  const v1::Stats after = Stats();
  EXPECT_EQ(after.bytes_host_to_gpu(), before.bytes_host_to_gpu()) << "a second copy was made";
  EXPECT_EQ(after.gpu().objects(), before.gpu().objects());
  EXPECT_EQ(after.gpu().hits(), before.gpu().hits() + 1);
  ExpectTensorsMatch(**session, *lease);
}

TEST_F(ApiTest, SessionsGoOverTheSessionSocketAndTheGrpcStreamAlike) {
  auto fast = client_->OpenSession();
  ASSERT_THAT(fast, IsOk());
  EXPECT_STREQ((*fast)->transport(), "socket");
  // Without the session socket (or where nothing answers on it) sessions use the gRPC stream.
  for (const std::string& path : {std::string(), absl::StrCat(dir_.path(), "/nothing.sock")}) {
    ClientOptions options;
    options.socket_path = socket_path();
    options.session_socket_path = path;
    auto client = Client::Connect(options);
    ASSERT_THAT(client, IsOk());
    auto session = (*client)->OpenSession();
    ASSERT_THAT(session, IsOk());
    EXPECT_STREQ((*session)->transport(), "grpc");
    auto lease = (*session)->Fetch(Key(1));
    ASSERT_THAT(lease, IsOk());
    ExpectTensorsMatch(**session, *lease);
    // What one transport stores the other fetches.
    std::string bytes(4096, '\0');
    testing::FillPattern(bytes.data(), bytes.size(), 7);
    ASSERT_THAT(StoreBytes(**session, "acts/over_grpc", bytes), IsOk());
    auto back = (*fast)->Fetch("acts/over_grpc");
    ASSERT_THAT(back, IsOk());
    EXPECT_EQ(Bytes(**fast, *back), bytes);
  }
}

TEST_F(ApiTest, EvictingAPrefixFromTheHostTierCountsEachStoredObjectOnce) {
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  std::string bytes(64 * 1024, '\0');
  testing::FillPattern(bytes.data(), bytes.size(), 9);
  ASSERT_THAT(StoreBytes(**session, "acts/one", bytes), IsOk());
  auto evicted = client_->Evict("acts/", v1::TIER_HOST);
  ASSERT_THAT(evicted, IsOk());
  EXPECT_EQ(evicted->evicted(), 1u);
  EXPECT_EQ(evicted->skipped(), 0u);
}

constexpr int Code(absl::StatusCode code) { return static_cast<int>(code); }

// Connects to the session socket, sends `bytes` and nothing more (a half-close); returns what the
// daemon sent back before it closed the connection.
std::string SendRawToSessionSocket(const std::string& path, const std::string& bytes) {
  const int fd = ConnectUnix(path);
  EXPECT_THAT(SendAll(fd, bytes), IsOk());
  ::shutdown(fd, SHUT_WR);
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::string answer;
  char buffer[4096];
  ssize_t got;
  while ((got = ::recv(fd, buffer, sizeof(buffer), 0)) > 0) answer.append(buffer, got);
  // Closed: an end of stream, or a reset when the daemon left some of what was sent unread.
  EXPECT_TRUE(got == 0 || (got < 0 && errno == ECONNRESET))
      << "the daemon did not close the connection: " << std::strerror(errno);
  ::close(fd);
  return answer;
}

TEST_F(ApiTest, TheSessionSocketClosesOnWhatIsNotItsProtocolAndKeepsServing) {
  const std::string path = SessionSocketPathFor(socket_path());
  const std::string hello(SessionSocketHello());
  // A wrong greeting: closed without an answer.
  EXPECT_EQ(SendRawToSessionSocket(path, "GET / HTTP/1.1\r\n\r\n"), "");
  // A frame longer than the limit, and a frame that is no SessionRequest: the greeting comes back,
  // then the connection is closed.
  std::string oversize = hello + std::string("\xff\xff\xff\x7f", 4);
  EXPECT_EQ(SendRawToSessionSocket(path, oversize), hello);
  EXPECT_EQ(SendRawToSessionSocket(path, hello + EncodeFrame(std::string(8, '\xff'))), hello);
  // A connection that ends inside a frame: 16 bytes announced, 3 sent.
  EXPECT_EQ(SendRawToSessionSocket(path, hello + EncodeFrame(std::string(16, 'x')).substr(0, 7)),
            hello);
  // A well-formed request before open is answered FAILED_PRECONDITION, like on the gRPC stream.
  v1::SessionRequest fetch;
  fetch.set_request_id(1);
  fetch.mutable_fetch()->set_key(Key(0));
  {
    const int fd = ConnectUnix(path);
    ASSERT_THAT(SendAll(fd, hello + EncodeFrame(fetch.SerializeAsString())), IsOk());
    std::string greeting(hello.size(), '\0');
    ASSERT_THAT(ReadExactly(fd, greeting.data(), greeting.size()), IsOk());
    std::string payload;
    ASSERT_THAT(ReadFrame(fd, payload), IsOk());
    v1::SessionResponse response;
    ASSERT_TRUE(response.ParseFromString(payload));
    EXPECT_EQ(response.request_id(), 1u);
    EXPECT_EQ(response.code(), Code(absl::StatusCode::kFailedPrecondition));
    ::close(fd);
  }
  // The daemon serves on.
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  auto lease = (*session)->Fetch(Key(0));
  ASSERT_THAT(lease, IsOk());
  ExpectTensorsMatch(**session, *lease);
  EXPECT_EQ(Stats().sessions(), 1u);
}

TEST_F(ApiTest, LeasedBytesNeverChangeWhileAnotherClientForcesEviction) {
  auto holder = StartPeer({"hold", Key(0), expected_dir(), "3"});
  ASSERT_NE(holder, nullptr);
  ASSERT_THAT(holder->ReadLine(kTimeout), ::tierd::testing::IsOkAndHolds(std::string("holding")));
  EXPECT_THAT(client_->Evict(Key(0), v1::TIER_GPU),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  const absl::Time end = absl::Now() + absl::Seconds(2);
  int fetches = 0;
  while (absl::Now() < end) {
    for (int block = 1; block < kBlocks; ++block) {
      auto lease = (*session)->Fetch(Key(block));
      ASSERT_THAT(lease, IsOk());
      ++fetches;
    }
    auto evicted = client_->Evict("m/", v1::TIER_ALL);
    ASSERT_THAT(evicted, IsOk());
    EXPECT_GE(evicted->skipped(), 1u);  // the held block
  }
  EXPECT_THAT(holder->Wait(kTimeout), ::tierd::testing::IsOkAndHolds(0));
  EXPECT_GT(fetches, kBlocks);
}

TEST_F(ApiTest, PinnedObjectStaysOnTheGpuUntilUnpinned) {
  auto pinner = client_->OpenSession();
  ASSERT_THAT(pinner, IsOk());
  ASSERT_THAT((*pinner)->Pin(Key(0)), IsOk());
  EXPECT_EQ(Stats().pins(), 1u);
  auto other = client_->OpenSession();
  ASSERT_THAT(other, IsOk());
  for (int round = 0; round < 2; ++round) {
    for (int block = 1; block < kBlocks; ++block) ASSERT_THAT((*other)->Fetch(Key(block)), IsOk());
  }
  // Releases drain and copies finish asynchronously; only the pin may hold anything after that.
  ASSERT_TRUE(WaitForStats(
      [](const v1::Stats& s) { return s.leases() == 0 && s.copies_in_flight() == 0; }, kTimeout));
  auto evicted = client_->Evict("m/", v1::TIER_GPU);
  ASSERT_THAT(evicted, IsOk());
  EXPECT_EQ(evicted->skipped(), 1u);
  EXPECT_THAT(client_->Evict(Key(0), v1::TIER_GPU),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  const uint64_t hits = Stats().gpu().hits();
  ASSERT_THAT((*other)->Fetch(Key(0)), IsOk());
  EXPECT_EQ(Stats().gpu().hits(), hits + 1);
  ASSERT_THAT((*pinner)->Unpin(Key(0)), IsOk());
  EXPECT_THAT((*pinner)->Unpin(Key(0)), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(WaitForStats([](const v1::Stats& s) { return s.leases() == 0; }, kTimeout));
  EXPECT_THAT(client_->Evict(Key(0), v1::TIER_GPU), IsOk());
}

TEST_F(ApiTest, KilledClientsLeasesAreFreedWhileOthersKeepWorking) {
  auto holder = StartPeer({"hold-forever", Key(1)});
  ASSERT_NE(holder, nullptr);
  ASSERT_THAT(holder->ReadLine(kTimeout), ::tierd::testing::IsOkAndHolds(std::string("holding")));
  EXPECT_EQ(Stats().leases(), 1u);
  EXPECT_EQ(Stats().sessions(), 1u);
  auto worker = StartPeer({"verify", "m", expected_dir(), "2"});
  ASSERT_NE(worker, nullptr);
  holder->Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  ASSERT_THAT(holder->Wait(kTimeout), IsOk());
  EXPECT_TRUE(WaitForStats([](const v1::Stats& s) { return s.leases() == 0 || s.sessions() == 1; },
                           kTimeout));
  EXPECT_THAT(worker->Wait(kTimeout), ::tierd::testing::IsOkAndHolds(0));
  EXPECT_TRUE(WaitForStats([](const v1::Stats& s) { return s.leases() == 0 && s.sessions() == 0; },
                           kTimeout));
  // Soon after the session ends (the kill plus the daemon noticing the socket closed); 5 s leaves
  // room for a loaded machine.
  EXPECT_LT(absl::Now() - killed, absl::Seconds(5));
  EXPECT_THAT(client_->Evict(Key(1), v1::TIER_GPU), IsOk());
  RecordProperty("clients_killed", 1);
}

// 100 client processes SIGKILLed one after another, half while holding a lease and half at a
// moment that may fall anywhere in connecting, opening and fetching: the daemon ends up holding
// nothing for them (stats back to the baseline) and still serves every block with its bytes.
TEST_F(ApiTest, AHundredClientsKilledMidLeaseLeaveNothingBehind) {
  constexpr int kKills = 100;
  int killed_holding = 0;
  for (int i = 0; i < kKills; ++i) {
    auto peer = StartPeer({"hold-forever", Key(i % kBlocks)});
    ASSERT_NE(peer, nullptr);
    if (i % 2 == 0) {
      ASSERT_THAT(peer->ReadLine(kTimeout), ::tierd::testing::IsOkAndHolds(std::string("holding")))
          << "kill " << i;
      ++killed_holding;
    } else {
      absl::SleepFor(absl::Milliseconds(i % 7 * 5));
    }
    peer->Signal(SIGKILL);
    ASSERT_THAT(peer->Wait(kTimeout), IsOk());
  }
  EXPECT_EQ(killed_holding, kKills / 2);
  EXPECT_TRUE(WaitForStats(
      [](const v1::Stats& s) {
        return s.sessions() == 0 && s.leases() == 0 && s.reservations() == 0 && s.pins() == 0;
      },
      kTimeout))
      << Stats().DebugString();
  const v1::Stats after_kills = Stats();
  EXPECT_EQ(after_kills.copies_in_flight(), 0u);
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  for (int block = 0; block < kBlocks; ++block) {
    auto lease = (*session)->Fetch(Key(block));
    ASSERT_THAT(lease, IsOk()) << Key(block);
    ExpectTensorsMatch(**session, *lease);
    lease->Release();
  }
  // For docs/RELIABILITY.md (tests/reliability_report.py).
  RecordProperty("clients_killed", kKills);
  RecordProperty("clients_killed_holding_a_lease", killed_holding);
  // What the dead clients left, before this test's own fetches above take and release leases.
  RecordProperty("leases_left", static_cast<int>(after_kills.leases()));
}

// A client killed after releasing a lease whose read was still queued leaves a done event that
// will never complete (on CUDA its context is gone with the kernel; on the host backend its stream
// thread), and a drain stream waiting on it. SIGTERM must still end the daemon with status 0 soon
// after the grace: the teardown skips what would wait for the device to go idle, without needing
// the 10 s bound.
TEST_F(ApiTest, SigtermAfterAClientDiedWithAReadQueuedExitsZeroWithinTheBound) {
  auto reader = StartPeer({"slow-read", Key(0), expected_dir(), "60000"});
  ASSERT_NE(reader, nullptr);
  ASSERT_THAT(reader->ReadLine(kTimeout), ::tierd::testing::IsOkAndHolds(std::string("released")));
  reader->Signal(SIGKILL);
  ASSERT_THAT(reader->Wait(kTimeout), IsOk());
  // The daemon still serves others meanwhile.
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  auto lease = (*session)->Fetch(Key(1));
  ASSERT_THAT(lease, IsOk());
  ExpectTensorsMatch(**session, *lease);
  lease->Release();
  session->reset();
  const absl::Time signalled = absl::Now();
  daemon_->Signal(SIGTERM);
  // --shutdown-grace-ms=2000 plus slack for a loaded machine, well short of the 10 s bound.
  EXPECT_THAT(daemon_->Wait(absl::Seconds(20)), ::tierd::testing::IsOkAndHolds(0));
  EXPECT_LT(absl::Now() - signalled, absl::Seconds(2 + 5));
  daemon_.reset();
}

// A session driven with raw protocol messages, for the errors the C++ client never provokes.
class RawSession {
 public:
  explicit RawSession(Client& client) : stream_(client.stub().Session(&context_)) {
    v1::SessionRequest open;
    open.mutable_open()->set_client_name("raw");
    EXPECT_EQ(Call(open).code(), 0);
  }
  ~RawSession() {
    stream_->WritesDone();
    (void)stream_->Finish();
  }
  v1::SessionResponse Call(v1::SessionRequest request) {
    request.set_request_id(++next_id_);
    EXPECT_TRUE(stream_->Write(request));
    v1::SessionResponse response;
    EXPECT_TRUE(stream_->Read(&response));
    EXPECT_EQ(response.request_id(), request.request_id());
    return response;
  }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionResponse>> stream_;
  uint64_t next_id_ = 0;
};

// Lease ids belong to their session: another session naming the same id releases nothing of the
// first one's.
TEST_F(ApiTest, ASessionCannotReleaseAnotherSessionsLease) {
  RawSession owner(*client_);
  v1::SessionRequest fetch;
  fetch.mutable_fetch()->set_key(Key(0));
  const v1::SessionResponse leased = owner.Call(fetch);
  ASSERT_EQ(leased.code(), 0) << leased.message();
  const uint64_t lease_id = leased.lease().lease_id();
  RawSession intruder(*client_);
  v1::SessionRequest release;
  release.mutable_release()->set_lease_id(lease_id);
  const v1::SessionResponse refused = intruder.Call(release);
  EXPECT_EQ(refused.code(), static_cast<int>(absl::StatusCode::kNotFound)) << refused.message();
  EXPECT_EQ(Stats().leases(), 1u);  // still the owner's
  const v1::SessionResponse released = owner.Call(release);
  EXPECT_EQ(released.code(), 0) << released.message();
  EXPECT_TRUE(WaitForStats([](const v1::Stats& s) { return s.leases() == 0; }, kTimeout));
}

TEST_F(ApiTest, EachFailureHasItsPreciseStatus) {
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  // NOT_FOUND: unknown keys and models.
  EXPECT_THAT((*session)->Fetch("m/blocks.99"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT((*session)->Fetch("nope/x"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(client_->ListObjects("nope"), StatusIs(absl::StatusCode::kNotFound));
  // INVALID_ARGUMENT: malformed keys and requests, with the field named.
  auto malformed = (*session)->Fetch("no-slash");
  EXPECT_THAT(malformed, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(malformed.status().message()), HasSubstr("fetch.key"));
  std::string bytes(1024, 'x');
  StoreRequest bad;
  bad.key = "acts/bad";
  bad.data = bytes.data();
  bad.size = bytes.size();
  v1::TensorInfo tensor;
  tensor.set_name("t");
  tensor.set_dtype("F77");
  bad.tensors.push_back(tensor);
  absl::Status bad_store = (*session)->StoreAsync(bad);
  EXPECT_THAT(bad_store, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(bad_store.message()), HasSubstr("reserve.tensors[0]"));
  bad.tensors.clear();
  bad.key = "m/taken";  // a registered model's namespace
  EXPECT_THAT((*session)->StoreAsync(bad), StatusIs(absl::StatusCode::kInvalidArgument));
  // RESOURCE_EXHAUSTED: the session's lease quota (3), then the pool (four objects).
  std::vector<Lease> held;
  for (int block = 0; block < 3; ++block) {
    auto lease = (*session)->Fetch(Key(block));
    ASSERT_THAT(lease, IsOk());
    held.push_back(*std::move(lease));
  }
  EXPECT_THAT((*session)->Fetch(Key(3)), StatusIs(absl::StatusCode::kResourceExhausted));
  auto other = client_->OpenSession();
  ASSERT_THAT(other, IsOk());
  auto fourth = (*other)->Fetch(Key(3));
  ASSERT_THAT(fourth, IsOk());
  EXPECT_THAT((*other)->Fetch(Key(4)), StatusIs(absl::StatusCode::kResourceExhausted));
  held.clear();
  // The releases went out quiet, unanswered; a call on the same session is answered only after the
  // daemon took them, so the fetch below, on another connection, waits for their buffers instead
  // of finding the pool full.
  ASSERT_THAT((*session)->Prefetch({}), IsOk());
  // FAILED_PRECONDITION: releasing twice, committing what was not reserved, unpinning what was
  // not pinned.
  {
    RawSession raw(*client_);
    v1::SessionRequest fetch;
    fetch.mutable_fetch()->set_key(Key(5));
    v1::SessionResponse leased = raw.Call(fetch);
    ASSERT_EQ(leased.code(), 0) << leased.message();
    v1::SessionRequest release;
    release.mutable_release()->set_lease_id(leased.lease().lease_id());
    EXPECT_EQ(raw.Call(release).code(), 0);
    EXPECT_EQ(raw.Call(release).code(), Code(absl::StatusCode::kFailedPrecondition));
    release.mutable_release()->set_lease_id(12345);
    EXPECT_EQ(raw.Call(release).code(), Code(absl::StatusCode::kNotFound));
    v1::SessionRequest commit;
    commit.mutable_commit()->set_reservation_id(7);
    EXPECT_EQ(raw.Call(commit).code(), Code(absl::StatusCode::kFailedPrecondition));
    v1::SessionRequest unpin;
    unpin.mutable_unpin()->set_key(Key(5));
    EXPECT_EQ(raw.Call(unpin).code(), Code(absl::StatusCode::kFailedPrecondition));
    v1::SessionRequest empty;
    EXPECT_EQ(raw.Call(empty).code(), Code(absl::StatusCode::kInvalidArgument));
  }
  // DATA_LOSS: a byte changed on disk behind the daemon's back (same size and mtime).
  fourth->Release();
  ASSERT_THAT(client_->Evict(Key(6), v1::TIER_ALL).status(), IsOk());
  {
    auto lease = (*session)->Fetch(Key(6));  // the first read records the checksum
    ASSERT_THAT(lease, IsOk());
  }
  // Every lease is released by now; wait for the releases to drain and the copy to finish.
  ASSERT_TRUE(WaitForStats(
      [](const v1::Stats& s) { return s.leases() == 0 && s.copies_in_flight() == 0; }, kTimeout));
  ASSERT_THAT(client_->Evict(Key(6), v1::TIER_ALL).status(), IsOk());
  const std::string file = absl::StrCat(model_dir("model"), "/model.safetensors");
  struct stat before;
  ASSERT_EQ(::stat(file.c_str(), &before), 0);
  const int fd = ::open(file.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  // Block 6's first tensor starts 12 tensors of 256 KiB into the data.
  const off_t header_and_more = before.st_size - (kBlocks * 2 - 12) * kRows * kCols * 4 + 100;
  ASSERT_EQ(::pwrite(fd, "\xff\xfe", 2, header_and_more), 2);
  ::close(fd);
  const struct timespec times[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, file.c_str(), times, 0), 0);
  EXPECT_THAT((*session)->Fetch(Key(6)), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_GE(Stats().checksum_failures(), 1u);
  // UNAVAILABLE: the daemon is shutting down.
  daemon_->Signal(SIGTERM);
  EXPECT_THAT(daemon_->Wait(kTimeout), ::tierd::testing::IsOkAndHolds(0));
  daemon_.reset();
  EXPECT_THAT((*session)->Fetch(Key(0)), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(client_->OpenSession(), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(ApiTest, ADroppedAndReRegisteredModelNeverServesItsOldBytes) {
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  {
    auto lease = (*session)->Fetch(Key(0));
    ASSERT_THAT(lease, IsOk());
    ExpectTensorsMatch(**session, *lease);
  }
  ASSERT_THAT(client_->DropModel("m"), IsOk());
  EXPECT_THAT((*session)->Fetch(Key(0)), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_THAT(WriteModel("model2", /*seed=*/2), IsOk());
  ASSERT_THAT(client_->RegisterModel("m", model_dir("model2"), v1::GROUPING_BLOCK), IsOk());
  auto lease = (*session)->Fetch(Key(0));
  ASSERT_THAT(lease, IsOk());
  ExpectTensorsMatch(**session, *lease);  // expected_ now holds the second model's bytes
}

TEST_F(ApiTest, TierctlCommandsWorkAndFailWithTheStatusName) {
  auto loaded = Tierctl({"load", "p", model_dir("model"), "--group=tensor"});
  EXPECT_EQ(loaded.exit_code, 0) << loaded.output;
  EXPECT_THAT(loaded.output, HasSubstr("16 tensors"));
  EXPECT_THAT(Tierctl({"ls"}).output, HasSubstr("p "));
  EXPECT_THAT(Tierctl({"ls", "m"}).output, HasSubstr("m/blocks.7"));
  EXPECT_EQ(Tierctl({"prefetch", Key(1), Key(2)}).exit_code, 0);

  const std::string out = absl::StrCat(dir_.path(), "/out.bin");
  EXPECT_EQ(Tierctl({"get", "p/blocks.3.ffn.up.weight", "-o", out}).exit_code, 0);
  EXPECT_EQ(testing::ReadWholeFile(out), expected_["blocks.3.ffn.up.weight"]);

  const std::string in = absl::StrCat(dir_.path(), "/in.bin");
  ASSERT_THAT(testing::WriteFile(in, "stored through tierctl"), IsOk());
  EXPECT_EQ(Tierctl({"put", "acts/t", in}).exit_code, 0);
  EXPECT_EQ(Tierctl({"evict", "acts/t", "--tier=host"}).exit_code, 0);
  EXPECT_EQ(Tierctl({"get", "acts/t", "-o", out}).exit_code, 0);
  EXPECT_EQ(testing::ReadWholeFile(out), "stored through tierctl");

  auto stats = Tierctl({"stats", "--json"});
  ASSERT_EQ(stats.exit_code, 0);
  nlohmann::json json = nlohmann::json::parse(stats.output);
  EXPECT_EQ(json["models"], 2);
  EXPECT_GE(json["bytes_host_to_gpu"].get<uint64_t>(), kRows * kCols * 4);

  // The status name goes to stderr.
  auto missing = RunProgram({"/bin/sh", "-c",
                             absl::StrCat(SiblingBinary("tierctl"), " --socket=", socket_path(),
                                          " get m/blocks.42 -o ", out, " 2>&1")},
                            kTimeout);
  ASSERT_THAT(missing, IsOk());
  EXPECT_EQ(missing->exit_code, 1);
  EXPECT_THAT(missing->output, HasSubstr("NOT_FOUND"));
  EXPECT_EQ(Tierctl({"frobnicate"}).exit_code, 2);
}

// A key holds whatever bytes a tensor's name does. tierctl ls shows every key whole, control
// characters escaped as --json escapes them, rather than stopping at a NUL or letting a name
// drive the terminal (ESC).
TEST_F(ApiTest, TierctlLsEscapesKeysAsJsonDoes) {
  const std::string odd = model_dir("odd");
  ASSERT_EQ(::mkdir(odd.c_str(), 0755), 0);
  const std::string nul_name("w\0hidden", 8);
  ASSERT_THAT(testing::WriteSafetensors(absl::StrCat(odd, "/model.safetensors"),
                                        {RandomTensor(nul_name, "F32", {2, 2}, 1),
                                         RandomTensor("clear\x1b[2J", "F32", {2, 2}, 2),
                                         RandomTensor("back\\slash", "F32", {2, 2}, 3)}),
              IsOk());
  auto loaded = Tierctl({"load", "odd", odd, "--group=tensor"});
  ASSERT_EQ(loaded.exit_code, 0) << loaded.output;

  auto listed = Tierctl({"ls", "odd"});
  EXPECT_EQ(listed.exit_code, 0);
  EXPECT_THAT(listed.output, HasSubstr("odd/w\\u0000hidden "));
  EXPECT_THAT(listed.output, HasSubstr("odd/clear\\u001b[2J "));
  EXPECT_THAT(listed.output, HasSubstr("odd/back\\\\slash "));
  EXPECT_THAT(listed.output, HasSubstr("3 objects"));
  EXPECT_EQ(listed.output.find('\0'), std::string::npos);
  EXPECT_EQ(listed.output.find('\x1b'), std::string::npos);

  // --json carries the same keys, escaped by JSON itself.
  auto json = Tierctl({"--json", "ls", "odd"});
  ASSERT_EQ(json.exit_code, 0);
  const nlohmann::json listing = nlohmann::json::parse(json.output);
  std::vector<std::string> keys;
  for (const auto& object : listing["objects"]) {
    keys.push_back(object["key"].get<std::string>());
  }
  EXPECT_THAT(keys, ::testing::UnorderedElementsAre(absl::StrCat("odd/", nul_name),
                                                    "odd/clear\x1b[2J", "odd/back\\slash"));
}

}  // namespace
}  // namespace tierd
