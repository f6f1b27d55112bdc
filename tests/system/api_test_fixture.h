// The fixture of api_test: a daemon process on the device under test with a model of kBlocks
// blocks registered, a client, the expected bytes of every tensor, and peer processes (api_peer).
#ifndef TIERD_TESTS_SYSTEM_API_TEST_FIXTURE_H_
#define TIERD_TESTS_SYSTEM_API_TEST_FIXTURE_H_

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
namespace api_test {

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

// A status code as the session protocol carries it.
constexpr int Code(absl::StatusCode code) { return static_cast<int>(code); }

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

  // The daemon's arguments: the fixture's, each replaced by the flag of that name in extra_args_
  // (tierd refuses a flag given twice), then the rest of extra_args_.
  std::vector<std::string> TierdArgs() const {
    auto name = [](const std::string& arg) { return arg.substr(0, arg.find('=')); };
    std::vector<std::string> args;
    for (const std::string& arg : DefaultTierdArgs()) {
      bool replaced = false;
      for (const std::string& extra : extra_args_) replaced |= name(extra) == name(arg);
      if (!replaced) args.push_back(arg);
    }
    args.insert(args.end(), extra_args_.begin(), extra_args_.end());
    return args;
  }

  std::vector<std::string> DefaultTierdArgs() const {
    return {SiblingBinary("tierd"),
            absl::StrCat("--device=", testing::DeviceUnderTest().ToString()),
            absl::StrCat("--socket=", socket_path()),
            absl::StrCat("--state-dir=", dir_.path(), "/state"), "--host-cache-bytes=16MiB",
            "--gpu-pool-bytes=2MiB", "--gpu-slab-bytes=1MiB", "--session-max-leases=3",
            "--shutdown-grace-ms=2000",
            // Off by default in the daemon; the tests serve weights through it.
            "--compress-weights=true", "--decode-scratch-mib=64"};
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

  // Defined with its tests in api_test.cc.
  void ExpectAReadStillRunningAfterItsReleaseSeesTheBytesItWasLeased(bool batched);

  v1::Stats Stats() {
    auto stats = client_->GetStats();
    EXPECT_THAT(stats, IsOk());
    return stats.ok() ? *stats : v1::Stats();
  }

  // Runs tierctl against the daemon with `args`.
  testing::RunResult Tierctl(const std::vector<std::string>& args) {
    auto result = testing::RunTierctl(socket_path(), args, kTimeout);
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

  // Evicts `key` from `tier`, again while it is refused as in use: the daemon's compressor
  // (--compress-weights) holds an object's host copy a moment after its read, and a copy to the
  // GPU holds it until the daemon has seen the copy complete. The last answer.
  absl::StatusOr<v1::EvictResponse> EvictOnceFree(const std::string& key, v1::Tier tier) {
    const absl::Time deadline = absl::Now() + kTimeout;
    while (true) {
      absl::StatusOr<v1::EvictResponse> evicted = client_->Evict(key, tier);
      if (evicted.status().code() != absl::StatusCode::kFailedPrecondition ||
          absl::Now() > deadline) {
        return evicted;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
  }

  TempDir dir_;
  std::vector<std::string> extra_args_;  // set before SetUp, by a derived fixture's constructor
  std::map<std::string, std::string> expected_;
  std::unique_ptr<Subprocess> daemon_;
  std::unique_ptr<Client> client_;
};

}  // namespace api_test
}  // namespace tierd

#endif  // TIERD_TESTS_SYSTEM_API_TEST_FIXTURE_H_
