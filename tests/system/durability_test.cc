// Durable stored objects across crashes of the daemon: tierd runs as a separate process and is
// SIGKILLed (no chance to flush anything), then started again on the same state directory. What
// was committed durable comes back with its bytes and tensors; everything else — objects stored
// without `durable`, durable ones replaced by a non-durable version or deleted — is NOT_FOUND,
// never an older version. Damaged files are never handed out.
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/tierd_client.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::tierd::testing::IsOk;
using ::tierd::testing::IsOkAndHolds;
using ::tierd::testing::SiblingBinary;
using ::tierd::testing::StatusIs;
using ::tierd::testing::Subprocess;
using ::tierd::testing::TempDir;

constexpr absl::Duration kTimeout = absl::Seconds(30);

class DurabilityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StartDaemon();
    ASSERT_NE(daemon_, nullptr);
  }

  void TearDown() override {
    session_.reset();
    client_.reset();
    if (daemon_ != nullptr) {
      daemon_->Signal(SIGTERM);
      EXPECT_THAT(daemon_->Wait(kTimeout), IsOkAndHolds(0));
    }
    RecordProperty("daemons_killed", kills_);  // for docs/RELIABILITY.md
  }

  std::string socket_path() const { return absl::StrCat(dir_.path(), "/gpu0.sock"); }
  std::string durable_dir() const { return absl::StrCat(dir_.path(), "/state/durable"); }

  // Starts tierd and connects a client and a session once it is SERVING.
  void StartDaemon() {
    auto daemon = testing::StartServingDaemon(
        {SiblingBinary("tierd"), "--device=host", absl::StrCat("--socket=", socket_path()),
         absl::StrCat("--state-dir=", dir_.path(), "/state"), "--gpu-pool-bytes=16MiB",
         "--host-cache-bytes=64MiB"},
        socket_path(), kTimeout);
    ASSERT_THAT(daemon, IsOk());
    daemon_ = *std::move(daemon);
    ClientOptions options;
    options.socket_path = socket_path();
    auto client = Client::Connect(options);
    ASSERT_THAT(client, IsOk());
    client_ = *std::move(client);
    auto session = client_->OpenSession();
    ASSERT_THAT(session, IsOk());
    session_ = *std::move(session);
  }

  // SIGKILL, then the same daemon again.
  void CrashAndRestart() {
    Kill();
    StartDaemon();
  }

  void Kill() {
    session_.reset();
    client_.reset();
    daemon_->Signal(SIGKILL);
    ASSERT_THAT(daemon_->Wait(kTimeout), IsOk());
    daemon_.reset();
    ++kills_;
  }

  // Stores `bytes` as `key` (one U8 tensor, so that the index is kept too) and waits for the
  // commit.
  absl::Status Store(const std::string& key, const std::string& bytes, bool durable) {
    StoreRequest store;
    store.durable = durable;
    v1::TensorInfo tensor;
    tensor.set_name("all");
    tensor.set_dtype("U8");
    tensor.add_shape(bytes.size());
    tensor.set_size(bytes.size());
    store.tensors.push_back(tensor);
    return testing::StoreBytes(*session_, key, bytes, store);
  }

  // The bytes of `key` as a fetch hands them out.
  absl::StatusOr<std::string> FetchBytes(const std::string& key) {
    ASSIGN_OR_RETURN(Lease lease, session_->Fetch(key));
    RETURN_IF_ERROR(session_->device().SynchronizeStream(session_->default_stream()));
    std::string bytes(static_cast<const char*>(lease.data()), lease.size());
    if (lease.tensors().size() != 1 || lease.tensors()[0].size() != lease.size()) {
      return absl::InternalError(absl::StrCat(key, ": its tensor index did not come back"));
    }
    lease.Release();
    return bytes;
  }

  // Drops `key` from the GPU and host tiers, keeping it (on disk), once its last fetch is done.
  absl::Status EvictFromMemory(const std::string& key) {
    const absl::Time deadline = absl::Now() + kTimeout;
    for (v1::Tier tier : {v1::TIER_GPU, v1::TIER_HOST}) {
      absl::StatusOr<v1::EvictResponse> evicted;
      do {
        evicted = client_->Evict(key, tier);
      } while (!evicted.ok() && evicted.status().code() == absl::StatusCode::kFailedPrecondition &&
               absl::Now() < deadline);
      RETURN_IF_ERROR(evicted.status());
    }
    return absl::OkStatus();
  }

  std::vector<std::string> DurableFiles(const std::string& suffix) const {
    std::vector<std::string> files;
    for (const auto& entry : std::filesystem::directory_iterator(durable_dir())) {
      if (absl::EndsWith(entry.path().string(), suffix)) files.push_back(entry.path().string());
    }
    return files;
  }

  TempDir dir_;
  std::unique_ptr<Subprocess> daemon_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Session> session_;
  int kills_ = 0;
};

TEST_F(DurabilityTest, DurableObjectsSurviveAKillAndNothingElseComesBack) {
  const std::string kept = testing::PatternBytes(300 * 1024, 1);
  const std::string replaced_v2 = testing::PatternBytes(70 * 1024, 3);
  ASSERT_THAT(Store("kv/kept", kept, /*durable=*/true), IsOk());
  ASSERT_THAT(Store("kv/volatile", testing::PatternBytes(4096, 2), /*durable=*/false), IsOk());
  ASSERT_THAT(Store("kv/newer", testing::PatternBytes(8192, 4), /*durable=*/true), IsOk());
  ASSERT_THAT(Store("kv/newer", replaced_v2, /*durable=*/true), IsOk());
  // A durable version replaced by a non-durable one, and a deleted one, must not come back.
  ASSERT_THAT(Store("kv/demoted", testing::PatternBytes(4096, 5), /*durable=*/true), IsOk());
  ASSERT_THAT(Store("kv/demoted", testing::PatternBytes(4096, 6), /*durable=*/false), IsOk());
  ASSERT_THAT(Store("kv/deleted", testing::PatternBytes(4096, 7), /*durable=*/true), IsOk());
  ASSERT_THAT(client_->Evict("kv/deleted", v1::TIER_ALL), IsOk());
  // Before any restart, a durable object evicted from memory comes back from its file.
  EXPECT_THAT(EvictFromMemory("kv/newer"), IsOk());
  EXPECT_THAT(FetchBytes("kv/newer"), IsOkAndHolds(replaced_v2));
  auto stats = client_->GetStats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->bytes_disk_to_host(), replaced_v2.size());
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->durable_objects(), 2u);
  EXPECT_EQ(stats->durable_bytes(), kept.size() + replaced_v2.size());
  EXPECT_EQ(DurableFiles(".tdo").size(), 2u);  // the replaced version's file is gone

  CrashAndRestart();
  ASSERT_NE(session_, nullptr);
  EXPECT_THAT(FetchBytes("kv/kept"), IsOkAndHolds(kept));
  EXPECT_THAT(FetchBytes("kv/newer"), IsOkAndHolds(replaced_v2));
  for (const char* gone : {"kv/volatile", "kv/demoted", "kv/deleted"}) {
    EXPECT_THAT(FetchBytes(gone), StatusIs(absl::StatusCode::kNotFound)) << gone;
  }
  stats = client_->GetStats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->durable_objects(), 2u);
  EXPECT_EQ(stats->stored_objects(), 2u);
  RecordProperty("durable_objects_recovered", static_cast<int>(stats->durable_objects()));

  // Recovered objects behave like any other: evicted from memory, read back from their file.
  EXPECT_THAT(EvictFromMemory("kv/kept"), IsOk());
  EXPECT_THAT(FetchBytes("kv/kept"), IsOkAndHolds(kept));
  // And they survive a second crash.
  CrashAndRestart();
  ASSERT_NE(session_, nullptr);
  EXPECT_THAT(FetchBytes("kv/kept"), IsOkAndHolds(kept));
}

TEST_F(DurabilityTest, DamagedFilesAreNeverHandedOutAndUnfinishedOnesAreRemoved) {
  const std::string bytes = testing::PatternBytes(64 * 1024, 11);
  ASSERT_THAT(Store("kv/flipped_payload", bytes, /*durable=*/true), IsOk());
  ASSERT_THAT(Store("kv/flipped_header", bytes, /*durable=*/true), IsOk());
  std::vector<std::string> files = DurableFiles(".tdo");
  ASSERT_EQ(files.size(), 2u);
  Kill();

  // Which file is which: the key is in the header's JSON.
  auto holds = [](const std::string& path, const std::string& text) {
    std::ifstream in(path, std::ios::binary);
    std::string head(4096, '\0');
    in.read(head.data(), head.size());
    return head.find(text) != std::string::npos;
  };
  const std::string payload_file = holds(files[0], "flipped_payload") ? files[0] : files[1];
  const std::string header_file = payload_file == files[0] ? files[1] : files[0];
  auto flip = [](const std::string& path, std::streamoff at) {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(at);
    char byte = 0;
    file.read(&byte, 1);
    byte ^= 0x40;
    file.seekp(at);
    file.write(&byte, 1);
  };
  flip(payload_file, 4096 + 1000);  // inside the object's bytes
  flip(header_file, 30);            // inside the metadata
  // A version whose commit was never acknowledged: written, not yet renamed.
  const std::string unfinished = absl::StrCat(durable_dir(), "/0123456789abcdef-99.tmp");
  std::ofstream(unfinished) << "half a version";

  StartDaemon();
  ASSERT_NE(session_, nullptr);
  EXPECT_THAT(FetchBytes("kv/flipped_payload"), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(FetchBytes("kv/flipped_header"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_TRUE(std::filesystem::exists(header_file + ".damaged"));
  EXPECT_FALSE(std::filesystem::exists(unfinished));
  auto stats = client_->GetStats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->checksum_failures(), 1u);
  // The daemon still serves: the key can be stored again.
  ASSERT_THAT(Store("kv/flipped_payload", bytes, /*durable=*/true), IsOk());
  EXPECT_THAT(FetchBytes("kv/flipped_payload"), IsOkAndHolds(bytes));
}

TEST_F(DurabilityTest, TierctlPutDurableSurvivesAKill) {
  const std::string file = absl::StrCat(dir_.path(), "/input.bin");
  const std::string bytes = testing::PatternBytes(12345, 21);
  std::ofstream(file, std::ios::binary) << bytes;
  auto put =
      testing::RunProgram({SiblingBinary("tierctl"), absl::StrCat("--socket=", socket_path()),
                           "put", "files/input", file, "--durable"},
                          kTimeout);
  ASSERT_THAT(put, IsOk());
  EXPECT_EQ(put->exit_code, 0) << put->output;
  EXPECT_THAT(put->output, HasSubstr("(durable)"));
  CrashAndRestart();
  ASSERT_NE(session_, nullptr);
  auto lease = session_->Fetch("files/input");
  ASSERT_THAT(lease, IsOk());
  ASSERT_THAT(session_->device().SynchronizeStream(session_->default_stream()), IsOk());
  EXPECT_EQ(std::string(static_cast<const char*>(lease->data()), lease->size()), bytes);
  lease->Release();
}

}  // namespace
}  // namespace tierd
