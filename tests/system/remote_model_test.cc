// Models in object storage, end to end against a real S3 endpoint (Ceph's RADOS Gateway,
// deploy/s3-gateway.sh): a daemon started with --s3-endpoint registers a model from
// s3://BUCKET/PREFIX/ (one file, or shards with their index), serves every tensor byte for byte,
// refuses an object changed since registration and locations outside --model-roots, answers
// UNAVAILABLE while the gateway stalls and serves once it is back, and never prints its keys; a
// restarted daemon and another sharing its --remote-cache-dir read nothing from the store again,
// and the node's daemons with --peers fetch each object from the store once.
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/tierd_client.h"
#include "testing/sample_weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_test_support.h"
#include "tests/s3_gateway.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::tierd::testing::FetchBytes;
using ::tierd::testing::IsOk;
using ::tierd::testing::IsOkAndHolds;
using ::tierd::testing::RunProgram;
using ::tierd::testing::S3Gateway;
using ::tierd::testing::SiblingBinary;
using ::tierd::testing::StatusIs;
using ::tierd::testing::TensorSpec;

constexpr absl::Duration kTimeout = absl::Seconds(60);
constexpr char kBucket[] = "models";

class RemoteModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<S3Gateway>> gateway = S3Gateway::Start({kBucket, "elsewhere"});
    ASSERT_THAT(gateway, IsOk());
    gateway_ = gateway->release();
  }
  static void TearDownTestSuite() {
    delete gateway_;
    gateway_ = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(gateway_, nullptr);
    credentials_file_ = absl::StrCat(dir_.path(), "/s3-credentials");
    std::ofstream(credentials_file_)
        << "[default]\naws_access_key_id = " << gateway_->credentials().access_key_id
        << "\naws_secret_access_key = " << gateway_->credentials().secret_access_key << "\n";
    ::chmod(credentials_file_.c_str(), 0600);
  }
  void TearDown() override {
    for (int i = kMaxDaemons - 1; i >= 0; --i) StopDaemon(i);
  }

  std::string socket_path(int i = 0) const { return absl::StrCat(dir_.path(), "/gpu", i, ".sock"); }
  std::string log_path() const { return absl::StrCat(dir_.path(), "/tierd.log"); }
  std::string cache_dir() const { return absl::StrCat(dir_.path(), "/remote-cache"); }

  // Starts daemon `i` (its log appended to log_path()) with `extra` flags; with `remote`, reading
  // the gateway (over HTTP unless `extra` gives another --s3-endpoint).
  void StartDaemon(bool remote = true, int i = 0, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {
        SiblingBinary("tierd"),
        absl::StrCat("--device=", testing::DeviceUnderTest().ToString()),
        absl::StrCat("--socket=", socket_path(i)),
        absl::StrCat("--state-dir=", dir_.path(), "/state", i),
        "--host-cache-bytes=32MiB",
        "--gpu-pool-bytes=8MiB",
        "--gpu-slab-bytes=2MiB",
        "--shutdown-grace-ms=500",  // a test may stop its daemon with a session open
        absl::StrCat("--model-roots=s3://", kBucket, "/")};
    if (remote) {
      // The gateway's HTTP endpoint, unless `extra` names one.
      if (std::none_of(extra.begin(), extra.end(), [](const std::string& flag) {
            return absl::StartsWith(flag, "--s3-endpoint=");
          })) {
        args.push_back(absl::StrCat("--s3-endpoint=", gateway_->endpoint().url));
      }
      args.insert(args.end(),
                  {absl::StrCat("--s3-credentials-file=", credentials_file_), "--remote-streams=4",
                   "--remote-part-mib=1", "--s3-stall-timeout-ms=1000", "--s3-attempts=2"});
    }
    args.insert(args.end(), extra.begin(), extra.end());
    // Through a shell that sends its log to a file the test reads (the program is $0, the rest
    // "$@").
    std::vector<std::string> wrapped = {"/bin/sh", "-c",
                                        absl::StrCat("exec \"$0\" \"$@\" 2>>", log_path())};
    wrapped.insert(wrapped.end(), args.begin(), args.end());
    auto daemon = testing::StartServingDaemon(wrapped, socket_path(i), kTimeout);
    ASSERT_THAT(daemon, IsOk());
    daemons_[i] = *std::move(daemon);
    ClientOptions options;
    options.socket_path = socket_path(i);
    auto client = Client::Connect(options);
    ASSERT_THAT(client, IsOk());
    clients_[i] = *std::move(client);
    if (i == 0) client_ = clients_[0].get();
  }
  void StopDaemon(int i = 0) {
    clients_[i].reset();
    if (i == 0) client_ = nullptr;
    if (daemons_[i] == nullptr) return;
    daemons_[i]->Signal(SIGTERM);
    EXPECT_THAT(daemons_[i]->Wait(kTimeout), IsOkAndHolds(0));
    daemons_[i].reset();
  }

  v1::Stats Stats(int i) {
    absl::StatusOr<v1::Stats> stats = clients_[i]->GetStats();
    EXPECT_THAT(stats, IsOk());
    return stats.ok() ? *stats : v1::Stats();
  }

  // Uploads a safetensors file of `tensors` as s3://models/KEY.
  void Upload(const std::string& key, const std::vector<TensorSpec>& tensors) {
    const std::string local = absl::StrCat(dir_.path(), "/upload.safetensors");
    ASSERT_THAT(testing::WriteSafetensors(local, tensors), IsOk());
    ASSERT_THAT(gateway_->PutObject(kBucket, key, testing::ReadWholeFile(local)), IsOk());
  }

  testing::RunResult Tierctl(const std::vector<std::string>& args) {
    auto result = testing::RunTierctl(socket_path(), args, kTimeout, /*with_stderr=*/true);
    EXPECT_THAT(result, IsOk());
    return result.ok() ? *result : testing::RunResult{};
  }

  void ExpectNoSecretIn(const std::string& text, const std::string& where) {
    EXPECT_THAT(text, Not(HasSubstr(gateway_->credentials().secret_access_key))) << where;
    EXPECT_THAT(text, Not(HasSubstr(gateway_->credentials().access_key_id))) << where;
  }

  static S3Gateway* gateway_;
  testing::TempDir dir_;
  std::string credentials_file_;
  static constexpr int kMaxDaemons = 2;
  std::unique_ptr<testing::Subprocess> daemons_[kMaxDaemons];
  std::unique_ptr<Client> clients_[kMaxDaemons];
  Client* client_ = nullptr;  // daemon 0's
};

S3Gateway* RemoteModelTest::gateway_ = nullptr;

TEST_F(RemoteModelTest, EveryTensorOfAModelInTheBucketIsServedByteForByte) {
  const std::vector<TensorSpec> tensors = {
      testing::RandomTensor("blocks.0.w", "F32", {300, 257}, 1),  // > 1 part: parts in parallel
      testing::RandomTensor("blocks.0.b", "F32", {257}, 2),
      testing::RandomTensor("blocks.1.w", "BF16", {3, 5, 7}, 3),
      testing::RandomTensor("head", "U8", {4097}, 4)};
  Upload("one/model.safetensors", tensors);
  ASSERT_THAT(gateway_->PutObject(kBucket, "one/README.md", "not a model file"), IsOk());
  StartDaemon();
  const testing::RunResult loaded =
      Tierctl({"load", "one", absl::StrCat("s3://", kBucket, "/one/"), "--group=tensor"});
  ASSERT_EQ(loaded.exit_code, 0) << loaded.output;
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  uint64_t bytes = 0;
  for (const TensorSpec& tensor : tensors) {
    EXPECT_THAT(FetchBytes(**session, absl::StrCat("one/", tensor.name)), IsOkAndHolds(tensor.data))
        << tensor.name;
    bytes += tensor.data.size();
  }
  absl::StatusOr<v1::Stats> stats = client_->GetStats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_GE(stats->remote_bytes_read(), bytes);
  EXPECT_EQ(stats->disk_bytes_read(), 0u);
  for (const std::vector<std::string>& command :
       {std::vector<std::string>{"ls"}, {"ls", "one"}, {"stats"}}) {
    const testing::RunResult shown = Tierctl(command);
    EXPECT_EQ(shown.exit_code, 0) << shown.output;
    ExpectNoSecretIn(shown.output, command[0]);
  }
  ExpectNoSecretIn(loaded.output, "tierctl load");
  StopDaemon();
  const std::string log = testing::ReadWholeFile(log_path());
  EXPECT_THAT(log, HasSubstr("remote models from"));
  ExpectNoSecretIn(log, "the daemon's log");
}

TEST_F(RemoteModelTest, ShardsWithTheirIndexAndARestartedDaemonReadingThemAgain) {
  const std::vector<TensorSpec> first = {testing::RandomTensor("layers.0.w", "F32", {64, 64}, 5)};
  const std::vector<TensorSpec> second = {testing::RandomTensor("layers.1.w", "F32", {64, 65}, 6)};
  Upload("sharded/model-00001-of-00002.safetensors", first);
  Upload("sharded/model-00002-of-00002.safetensors", second);
  ASSERT_THAT(
      gateway_->PutObject(kBucket, "sharded/model.safetensors.index.json",
                          R"({"weight_map": {"layers.0.w": "model-00001-of-00002.safetensors",
                                      "layers.1.w": "model-00002-of-00002.safetensors"}})"),
      IsOk());
  // Further down the prefix: not this model's.
  Upload("sharded/old/model.safetensors", first);
  StartDaemon();
  absl::StatusOr<v1::ModelSummary> summary = client_->RegisterModel(
      "sharded", absl::StrCat("s3://", kBucket, "/sharded"), v1::GROUPING_BLOCK);
  ASSERT_THAT(summary, IsOk());
  EXPECT_EQ(summary->files(), 2u);
  for (int restart = 0; restart < 2; ++restart) {
    auto session = client_->OpenSession();
    ASSERT_THAT(session, IsOk());
    auto lease = (*session)->Fetch("sharded/layers.1");
    ASSERT_THAT(lease, IsOk()) << restart;
    EXPECT_EQ(testing::LeaseBytes(**session, *lease), second[0].data) << restart;
    lease->Release();
    EXPECT_THAT(FetchBytes(**session, "sharded/layers.0"), IsOkAndHolds(first[0].data));
    session->reset();
    StopDaemon();
    StartDaemon();  // the registration is kept; the bytes are read from the bucket again
  }
}

TEST_F(RemoteModelTest, AHeaderLargerThanTheFirstReadAndManyFilesAreRegisteredWhole) {
  // 3000 tensors with long names: a header of about 400 KiB, past the scan's first 256 KiB read.
  std::vector<TensorSpec> many;
  for (int i = 0; i < 3000; ++i) {
    many.push_back(testing::RandomTensor(
        absl::StrCat("a.rather.long.module.path.of.a.deep.model.that.goes.on.and.on.layer", i,
                     ".weight"),
        "F32", {2}, 1000 + i));
  }
  Upload("wide/model-1.safetensors", many);
  // And further files, read at once.
  for (int f = 2; f <= 20; ++f) {
    Upload(absl::StrCat("wide/model-", f, ".safetensors"),
           {testing::RandomTensor(absl::StrCat("f", f), "F32", {16}, f)});
  }
  StartDaemon();
  absl::StatusOr<v1::ModelSummary> summary =
      client_->RegisterModel("wide", absl::StrCat("s3://", kBucket, "/wide/"), v1::GROUPING_TENSOR);
  ASSERT_THAT(summary, IsOk());
  EXPECT_EQ(summary->files(), 20u);
  EXPECT_EQ(summary->tensors(), 3019u);
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  for (int i : {0, 2999}) {
    EXPECT_THAT(FetchBytes(**session, absl::StrCat("wide/", many[i].name)),
                IsOkAndHolds(many[i].data));
  }
}

TEST_F(RemoteModelTest, ShardsAreReadAsRangesAndCompressedWeightsDecodeExactly) {
  // bf16 weights N(0, 0.02^2), as transformers initialises them: the compressor keeps them.
  constexpr uint64_t kRows = 96;
  constexpr uint64_t kCols = 2048;
  std::vector<TensorSpec> tensors;
  for (int i = 0; i < 3; ++i) {
    std::vector<uint16_t> words(kRows * kCols);
    codec::FillNormalWeights(codec::WordLayout::kBf16, 0.02, 50 + i, words.data(), words.size());
    std::string bytes(2 * words.size(), '\0');
    std::memcpy(bytes.data(), words.data(), bytes.size());
    tensors.push_back(TensorSpec{absl::StrCat("layers.", i, ".w"), "BF16", {kRows, kCols}, bytes});
  }
  Upload("bf16/model.safetensors", tensors);
  StartDaemon(/*remote=*/true, 0, {"--compress-weights=true"});
  ASSERT_THAT(
      client_->RegisterModel("bf16", absl::StrCat("s3://", kBucket, "/bf16/"), v1::GROUPING_TENSOR),
      IsOk());
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  // Rank 1 of 3 along each dimension: its rows are one range of the file, its columns a slice of
  // every row.
  for (uint32_t dim : {0u, 1u}) {
    const std::string key = ShardKey("bf16/layers.0.w", dim, 1, 3);
    auto lease = (*session)->Fetch(key);
    ASSERT_THAT(lease, IsOk()) << key;
    EXPECT_EQ(testing::LeaseBytes(**session, *lease), testing::TensorSplit(tensors[0], dim, 1, 3))
        << key;
  }
  // Whole objects, read again after the compressor has had them: decoded to the same bytes.
  for (const TensorSpec& tensor : tensors) {
    EXPECT_THAT(FetchBytes(**session, absl::StrCat("bf16/", tensor.name)),
                IsOkAndHolds(tensor.data));
  }
  // Each whole object held compressed once the compressor has been through it.
  const auto compressed = [&] {
    absl::StatusOr<std::vector<v1::ObjectInfo>> objects = client_->ListObjects("bf16");
    if (!objects.ok() || objects->size() != tensors.size()) return false;
    for (const v1::ObjectInfo& object : *objects) {
      if (object.host_bytes() == 0 || object.host_bytes() >= object.size()) return false;
    }
    return true;
  };
  for (const absl::Time deadline = absl::Now() + kTimeout;
       absl::Now() < deadline && !compressed();) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(compressed());
  for (const TensorSpec& tensor : tensors) {
    ASSERT_THAT(testing::EvictOnceFree(**session, absl::StrCat("bf16/", tensor.name), v1::TIER_GPU),
                IsOk());
  }
  for (const TensorSpec& tensor : tensors) {
    EXPECT_THAT(FetchBytes(**session, absl::StrCat("bf16/", tensor.name)),
                IsOkAndHolds(tensor.data));
  }
  EXPECT_GT(Stats(0).objects_decoded(), 0u);
}

TEST_F(RemoteModelTest, AnObjectChangedSinceRegistrationIsRefused) {
  const std::vector<TensorSpec> tensors = {testing::RandomTensor("w", "F32", {1024}, 7)};
  Upload("changing/model.safetensors", tensors);
  StartDaemon();
  ASSERT_THAT(client_->RegisterModel("changing", absl::StrCat("s3://", kBucket, "/changing/"),
                                     v1::GROUPING_TENSOR),
              IsOk());
  // Same size and layout, other bytes: only the ETag tells.
  Upload("changing/model.safetensors", {testing::RandomTensor("w", "F32", {1024}, 8)});
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  absl::StatusOr<std::string> fetched = FetchBytes(**session, "changing/w");
  EXPECT_THAT(fetched, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(fetched.status().message(), HasSubstr("changed"));
}

TEST_F(RemoteModelTest, LocationsOutsideTheRootsAndBrokenModelsAreRefusedSayingWhy) {
  Upload("bad/model.safetensors", {testing::RandomTensor("w", "F32", {16}, 9)});
  ASSERT_THAT(gateway_->PutObject("elsewhere", "m/model.safetensors", "x"), IsOk());
  ASSERT_THAT(gateway_->PutObject(kBucket, "truncated/model.safetensors",
                                  std::string("\x40\0\0\0\0\0\0\0{\"w\":", 12)),
              IsOk());
  StartDaemon();
  EXPECT_THAT(client_->RegisterModel("x", "s3://elsewhere/m/", v1::GROUPING_TENSOR),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(
      client_->RegisterModel("x", absl::StrCat("s3://", kBucket, "/none/"), v1::GROUPING_TENSOR),
      StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(client_->RegisterModel("x", absl::StrCat("s3://", kBucket, "/truncated/"),
                                     v1::GROUPING_TENSOR),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(client_->RegisterModel("x", "s3://Not_A_Bucket/m/", v1::GROUPING_TENSOR),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(client_->RegisterModel("x", absl::StrCat("s3://", kBucket, "/bad/"),
                                     v1::GROUPING_TENSOR, nullptr, /*verify=*/true),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(client_->ListModels(), IsOk());
}

TEST_F(RemoteModelTest, AStalledGatewayIsUnavailableAndALaterFetchIsServed) {
  const std::vector<TensorSpec> tensors = {testing::RandomTensor("w", "F32", {4096}, 10)};
  Upload("stall/model.safetensors", tensors);
  StartDaemon();
  ASSERT_THAT(client_->RegisterModel("stall", absl::StrCat("s3://", kBucket, "/stall/"),
                                     v1::GROUPING_TENSOR),
              IsOk());
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  ASSERT_THAT(gateway_->Pause(), IsOk());
  absl::StatusOr<std::string> stalled = FetchBytes(**session, "stall/w");
  // Local work is not held up meanwhile: the daemon answers.
  EXPECT_THAT(client_->GetStats(), IsOk());
  ASSERT_THAT(gateway_->Resume(), IsOk());
  EXPECT_THAT(stalled, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(FetchBytes(**session, "stall/w"), IsOkAndHolds(tensors[0].data));
}

// `count` tensors of about 1.5 MiB, named w0, w1, ...
std::vector<TensorSpec> MiBTensors(int count, int seed) {
  std::vector<TensorSpec> tensors;
  for (int i = 0; i < count; ++i) {
    tensors.push_back(testing::RandomTensor(absl::StrCat("w", i), "F32",
                                            {static_cast<uint64_t>(384 + i), 1024}, seed + i));
  }
  return tensors;
}

uint64_t BytesOf(const std::vector<TensorSpec>& tensors) {
  uint64_t bytes = 0;
  for (const TensorSpec& tensor : tensors) bytes += tensor.data.size();
  return bytes;
}

TEST_F(RemoteModelTest, ARestartedDaemonAndAnotherSharingItsCacheReadNothingFromTheStore) {
  const std::vector<TensorSpec> tensors = MiBTensors(12, 20);  // 18 MiB: 3 chunks of the cache
  Upload("cached/model.safetensors", tensors);
  const uint64_t file_bytes =
      testing::ReadWholeFile(absl::StrCat(dir_.path(), "/upload.safetensors")).size();
  const std::vector<std::string> cached = {absl::StrCat("--remote-cache-dir=", cache_dir()),
                                           "--remote-cache-bytes=256MiB"};
  const auto fetch_all = [&](int daemon) {
    auto session = clients_[daemon]->OpenSession();
    ASSERT_THAT(session, IsOk());
    for (const TensorSpec& tensor : tensors) {
      EXPECT_THAT(FetchBytes(**session, absl::StrCat("cached/", tensor.name)),
                  IsOkAndHolds(tensor.data))
          << "daemon " << daemon << ", " << tensor.name;
    }
  };
  StartDaemon(/*remote=*/true, 0, cached);
  ASSERT_THAT(client_->RegisterModel("cached", absl::StrCat("s3://", kBucket, "/cached/"),
                                     v1::GROUPING_TENSOR),
              IsOk());
  fetch_all(0);
  // Each chunk of the file fetched once, its header's bytes too; objects sharing a chunk with one
  // read before them are served from the cache already.
  v1::Stats stats = Stats(0);
  EXPECT_EQ(stats.remote_bytes_read(), file_bytes);
  EXPECT_LT(stats.remote_cache_bytes_read(), BytesOf(tensors));

  StopDaemon(0);
  StartDaemon(/*remote=*/true, 0, cached);
  fetch_all(0);
  stats = Stats(0);
  EXPECT_EQ(stats.remote_bytes_read(), 0u);
  EXPECT_EQ(stats.remote_cache_bytes_read(), BytesOf(tensors));
  const testing::RunResult shown = Tierctl({"stats"});
  EXPECT_THAT(shown.output, HasSubstr("read from the remote cache"));

  // Another daemon of the node, with a catalog of its own, over the same directory.
  StartDaemon(/*remote=*/true, 1, cached);
  ASSERT_THAT(clients_[1]->RegisterModel("cached", absl::StrCat("s3://", kBucket, "/cached/"),
                                         v1::GROUPING_TENSOR),
              IsOk());
  fetch_all(1);
  EXPECT_EQ(Stats(1).remote_bytes_read(), 0u);
  EXPECT_EQ(Stats(1).remote_cache_bytes_read(), BytesOf(tensors));
}

TEST_F(RemoteModelTest, TheNodesDaemonsWithPeersFetchEachObjectFromTheStoreOnce) {
  const std::vector<TensorSpec> tensors = MiBTensors(8, 40);
  Upload("node/model.safetensors", tensors);
  // One GET at a time for the two (their sockets share a directory, and so the lock file).
  const std::vector<std::string> node = {
      absl::StrCat("--peers=", socket_path(0), ",", socket_path(1)), "--remote-host-streams=1"};
  for (int i = 0; i < 2; ++i) {
    StartDaemon(/*remote=*/true, i, node);
    ASSERT_THAT(clients_[i]->RegisterModel("node", absl::StrCat("s3://", kBucket, "/node/"),
                                           v1::GROUPING_TENSOR),
                IsOk());
  }
  for (int i = 0; i < 2; ++i) {
    auto session = clients_[i]->OpenSession();
    ASSERT_THAT(session, IsOk());
    for (const TensorSpec& tensor : tensors) {
      EXPECT_THAT(FetchBytes(**session, absl::StrCat("node/", tensor.name)),
                  IsOkAndHolds(tensor.data))
          << "daemon " << i << ", " << tensor.name;
    }
  }
  // Each object by its home daemon only: the model once, whichever daemon was asked first. (Homes
  // hash the sockets' paths, which differ from run to run: how the model splits does too.)
  absl::StatusOr<std::vector<v1::ObjectInfo>> objects = clients_[0]->ListObjects("node");
  ASSERT_THAT(objects, IsOk());
  uint64_t homed[2] = {0, 0};
  for (const v1::ObjectInfo& object : *objects) {
    for (int i = 0; i < 2; ++i) homed[i] += object.home() == socket_path(i) ? object.size() : 0;
  }
  EXPECT_EQ(homed[0] + homed[1], BytesOf(tensors));
  for (int i = 0; i < 2; ++i) EXPECT_EQ(Stats(i).remote_bytes_read(), homed[i]) << "daemon " << i;
}

TEST_F(RemoteModelTest, AGatewayStoppedMidLoadIsUnavailableNothingWrongIsServedAndARetryLoads) {
  const std::vector<TensorSpec> tensors = MiBTensors(8, 60);
  Upload("stopped/model.safetensors", tensors);
  StartDaemon();
  ASSERT_THAT(client_->RegisterModel("stopped", absl::StrCat("s3://", kBucket, "/stopped/"),
                                     v1::GROUPING_TENSOR),
              IsOk());
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  for (int i = 0; i < 4; ++i) {
    EXPECT_THAT(FetchBytes(**session, absl::StrCat("stopped/", tensors[i].name)),
                IsOkAndHolds(tensors[i].data));
  }
  // The rest of the load is under way, its GETs in flight, when the gateway's process dies.
  ASSERT_THAT(gateway_->Pause(), IsOk());
  std::vector<absl::StatusOr<std::string>> rest(4, absl::UnknownError("not fetched"));
  std::thread loader([&] {
    for (int i = 4; i < 8; ++i) {
      rest[i - 4] = FetchBytes(**session, absl::StrCat("stopped/", tensors[i].name));
    }
  });
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_THAT(gateway_->StopGateway(), IsOk());
  loader.join();
  for (int i = 4; i < 8; ++i) {
    EXPECT_THAT(rest[i - 4], StatusIs(absl::StatusCode::kUnavailable)) << tensors[i].name;
  }
  ASSERT_THAT(gateway_->RestartGateway(), IsOk());
  for (const TensorSpec& tensor : tensors) {
    EXPECT_THAT(FetchBytes(**session, absl::StrCat("stopped/", tensor.name)),
                IsOkAndHolds(tensor.data))
        << tensor.name;
  }
}

TEST_F(RemoteModelTest, AnHttpsEndpointIsVerifiedAgainstTheSystemsCasOrTheGivenOnes) {
  const std::vector<TensorSpec> tensors = {testing::RandomTensor("w", "F32", {2048}, 70)};
  Upload("tls/model.safetensors", tensors);
  const std::string https = absl::StrCat("--s3-endpoint=", gateway_->tls_endpoint().url);
  StartDaemon(/*remote=*/true, 0, {https, absl::StrCat("--s3-ca-file=", gateway_->ca_file())});
  ASSERT_THAT(
      client_->RegisterModel("tls", absl::StrCat("s3://", kBucket, "/tls/"), v1::GROUPING_TENSOR),
      IsOk());
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  EXPECT_THAT(FetchBytes(**session, "tls/w"), IsOkAndHolds(tensors[0].data));
  session->reset();
  StopDaemon(0);
  // The system's store does not know the gateway's self-signed certificate.
  StartDaemon(/*remote=*/true, 1, {https});
  absl::StatusOr<v1::ModelSummary> refused = clients_[1]->RegisterModel(
      "tls", absl::StrCat("s3://", kBucket, "/tls/"), v1::GROUPING_TENSOR);
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(refused.status().message(), HasSubstr("certificate"));
}

TEST_F(RemoteModelTest, ADaemonWithoutAnEndpointOrCredentialsSaysSo) {
  const std::string unreadable = absl::StrCat(dir_.path(), "/open-credentials");
  std::ofstream(unreadable) << "[default]\naws_access_key_id = A\naws_secret_access_key = s\n";
  ::chmod(unreadable.c_str(), 0644);
  absl::StatusOr<testing::RunResult> refused = testing::RunProgramWithStderr(
      {SiblingBinary("tierd"), absl::StrCat("--device=", testing::DeviceUnderTest().ToString()),
       absl::StrCat("--socket=", socket_path()), absl::StrCat("--state-dir=", dir_.path(), "/s"),
       "--host-cache-bytes=8MiB", "--gpu-pool-bytes=4MiB", "--gpu-slab-bytes=2MiB",
       absl::StrCat("--s3-endpoint=", gateway_->endpoint().url),
       absl::StrCat("--s3-credentials-file=", unreadable)},
      kTimeout, testing::AddressSpaceForRefusal(8ull << 30));
  ASSERT_THAT(refused, IsOk());
  EXPECT_NE(refused->exit_code, 0);
  EXPECT_THAT(refused->output, HasSubstr("chmod 600"));
  Upload("plain/model.safetensors", {testing::RandomTensor("w", "F32", {16}, 11)});
  StartDaemon(/*remote=*/false);
  EXPECT_THAT(
      client_->RegisterModel("x", absl::StrCat("s3://", kBucket, "/plain/"), v1::GROUPING_TENSOR),
      StatusIs(absl::StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace tierd
