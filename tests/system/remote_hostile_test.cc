// A daemon reading models from a store that misbehaves (tests/s3_stub.h, on loopback), end to
// end: a silent store holds neither local registrations nor drops, registrations are bounded and
// stop when their caller goes, a bad answer never stays in the remote cache (the documented remedy
// — drop and register again — serves the right bytes), a refusal is not "stale" for good,
// SIGTERM during a remote load ends at once, tierctl honours its timeout and prints no control
// characters, the store's words never carry credentials into logs or errors, and the secrets
// leave the daemon's environment. The daemon serves its other clients through all of it.
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/tierd_client.h"
#include "common/directory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_test_support.h"
#include "tests/s3_stub.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::tierd::testing::FetchBytes;
using ::tierd::testing::IsOk;
using ::tierd::testing::IsOkAndHolds;
using ::tierd::testing::S3Stub;
using ::tierd::testing::SiblingBinary;
using ::tierd::testing::StatusIs;
using ::tierd::testing::StubAnswer;
using ::tierd::testing::StubRequest;
using ::tierd::testing::TensorSpec;

constexpr absl::Duration kTimeout = absl::Seconds(60);
constexpr char kBucket[] = "models";

class RemoteHostileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<S3Stub>> stub = S3Stub::Start();
    ASSERT_THAT(stub, IsOk());
    stub_ = *std::move(stub);
    credentials_file_ = absl::StrCat(dir_.path(), "/s3-credentials");
    std::ofstream(credentials_file_)
        << "[default]\naws_access_key_id = " << stub_->credentials().access_key_id
        << "\naws_secret_access_key = " << stub_->credentials().secret_access_key << "\n";
    ::chmod(credentials_file_.c_str(), 0600);
  }
  void TearDown() override { StopDaemon(); }

  std::string socket_path() const { return absl::StrCat(dir_.path(), "/gpu0.sock"); }
  std::string log_path() const { return absl::StrCat(dir_.path(), "/tierd.log"); }
  std::string cache_dir() const { return absl::StrCat(dir_.path(), "/remote-cache"); }
  std::string Log() const { return testing::ReadWholeFile(log_path()); }

  // Starts the daemon on the stub with `extra` flags (after the fixture's), `env` before it.
  void StartDaemon(const std::vector<std::string>& extra = {}, const std::string& env = "",
                   bool credentials_file = true) {
    std::vector<std::string> args = {
        SiblingBinary("tierd"),
        absl::StrCat("--device=", testing::DeviceUnderTest().ToString()),
        absl::StrCat("--socket=", socket_path()),
        absl::StrCat("--state-dir=", dir_.path(), "/state"),
        "--host-cache-bytes=32MiB",
        "--gpu-pool-bytes=8MiB",
        "--gpu-slab-bytes=2MiB",
        "--shutdown-grace-ms=500",
        absl::StrCat("--model-roots=s3://", kBucket, "/,", dir_.path()),
        absl::StrCat("--s3-endpoint=", stub_->endpoint().url),
        "--remote-streams=4",
        "--remote-part-mib=1",
        "--s3-stall-timeout-ms=1000",
        "--s3-attempts=2"};
    if (credentials_file) args.push_back(absl::StrCat("--s3-credentials-file=", credentials_file_));
    // A flag of `extra` replaces the fixture's.
    for (const std::string& flag : extra) {
      const std::string name = flag.substr(0, flag.find('=') + 1);
      args.erase(
          std::remove_if(args.begin(), args.end(),
                         [&](const std::string& arg) { return absl::StartsWith(arg, name); }),
          args.end());
      args.push_back(flag);
    }
    std::vector<std::string> wrapped = {"/bin/sh", "-c",
                                        absl::StrCat(env, " exec \"$0\" \"$@\" 2>>", log_path())};
    wrapped.insert(wrapped.end(), args.begin(), args.end());
    auto daemon = testing::StartServingDaemon(wrapped, socket_path(), kTimeout);
    ASSERT_THAT(daemon, IsOk());
    daemon_ = *std::move(daemon);
    ClientOptions options;
    options.socket_path = socket_path();
    auto client = Client::Connect(options);
    ASSERT_THAT(client, IsOk());
    client_ = *std::move(client);
  }
  // Stops the daemon (SIGTERM); its exit code.
  int StopDaemon() {
    client_.reset();
    if (daemon_ == nullptr) return 0;
    daemon_->Signal(SIGTERM);
    absl::StatusOr<int> code = daemon_->Wait(kTimeout);
    EXPECT_THAT(code, IsOk());
    daemon_.reset();
    return code.value_or(-1);
  }

  // A model of `tensors` as s3://models/PREFIX/model.safetensors on the stub.
  void Put(const std::string& prefix, const std::vector<TensorSpec>& tensors) {
    const std::string local = absl::StrCat(dir_.path(), "/upload.safetensors");
    ASSERT_THAT(testing::WriteSafetensors(local, tensors), IsOk());
    stub_->PutObject(kBucket, absl::StrCat(prefix, "/model.safetensors"),
                     testing::ReadWholeFile(local));
  }
  // A local model directory, under the roots.
  std::string LocalModel(const std::string& name) {
    const std::string directory = absl::StrCat(dir_.path(), "/", name);
    ::mkdir(directory.c_str(), 0700);
    EXPECT_THAT(testing::WriteSafetensors(absl::StrCat(directory, "/model.safetensors"),
                                          {testing::RandomTensor("blocks.0.w", "F32", {64}, 1)}),
                IsOk());
    return directory;
  }
  // A hook that leaves the listing of `prefix`/ silent (and every request under it).
  void SilenceUnder(const std::string& prefix) {
    stub_->SetHook([this, prefix](const StubRequest& request) -> std::optional<StubAnswer> {
      const bool under =
          absl::StartsWith(request.key, prefix) ||
          (request.IsListing() && absl::StartsWith(request.query.at("prefix"), prefix));
      if (!under) return std::nullopt;
      StubAnswer answer = stub_->Answer(request);
      answer.silence = absl::Seconds(120);
      return answer;
    });
  }

  testing::RunResult Tierctl(const std::vector<std::string>& args) {
    auto result = testing::RunTierctl(socket_path(), args, kTimeout, /*with_stderr=*/true);
    EXPECT_THAT(result, IsOk());
    return result.ok() ? *result : testing::RunResult{};
  }
  void ExpectNoCredentialsIn(const std::string& text, const std::string& where) {
    EXPECT_THAT(text, Not(HasSubstr(stub_->credentials().secret_access_key))) << where;
    EXPECT_THAT(text, Not(HasSubstr(stub_->credentials().access_key_id))) << where;
  }

  testing::TempDir dir_;
  std::unique_ptr<S3Stub> stub_;
  std::string credentials_file_;
  std::unique_ptr<testing::Subprocess> daemon_;
  std::unique_ptr<Client> client_;
};

// Registrations ran one at a time on one admin thread with no deadline: a silent endpoint held it
// 123 s, with every registration and drop behind it, and a registration whose client had timed
// out was registered afterwards anyway.
TEST_F(RemoteHostileTest, ASilentStoreHoldsNeitherLocalRegistrationsNorDrops) {
  StartDaemon({"--s3-stall-timeout-ms=60000"});  // silent for longer than any caller waits
  SilenceUnder("slow/");
  std::thread waiting([&] {
    ClientOptions options;
    options.socket_path = socket_path();
    auto mine = Client::Connect(options);
    ASSERT_THAT(mine, IsOk());
    v1::RegisterModelRequest request;
    request.set_name("slow");
    request.set_directory(absl::StrCat("s3://", kBucket, "/slow/"));
    EXPECT_THAT((*mine)->RegisterModel(request, nullptr, absl::Seconds(2)),
                StatusIs(absl::StatusCode::kDeadlineExceeded));
  });
  absl::SleepFor(absl::Milliseconds(300));  // the remote registration is under way
  const absl::Time start = absl::Now();
  ASSERT_THAT(client_->RegisterModel("local", LocalModel("local"), v1::GROUPING_BLOCK), IsOk());
  EXPECT_THAT(client_->DropModel("local"), IsOk());
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  waiting.join();
  // The caller is gone: the registration stops and is never made.
  stub_->SetHook(nullptr);
  Put("slow", {testing::RandomTensor("blocks.0.w", "F32", {64}, 2)});
  for (int i = 0; i < 100 && !absl::StrContains(Log(), "caller went away"); ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_THAT(Log(), HasSubstr("caller went away"));
  absl::StatusOr<std::vector<v1::ModelSummary>> models = client_->ListModels();
  ASSERT_THAT(models, IsOk());
  EXPECT_TRUE(models->empty());
}

// 24 queued 16 MiB requests held 1.1 GB: past the bound a registration is refused at once, and
// those let in stop with their callers.
TEST_F(RemoteHostileTest, RegistrationsAreBoundedAndEachEndsWithItsCaller) {
  StartDaemon({"--s3-stall-timeout-ms=60000"});
  SilenceUnder("slow/");
  std::atomic<int> refused{0}, timed_out{0};
  std::vector<std::thread> callers;
  for (int i = 0; i < 12; ++i) {
    callers.emplace_back([&, i] {
      ClientOptions options;
      options.socket_path = socket_path();
      auto mine = Client::Connect(options);
      ASSERT_THAT(mine, IsOk());
      v1::RegisterModelRequest request;
      request.set_name(absl::StrCat("slow", i));
      request.set_directory(absl::StrCat("s3://", kBucket, "/slow/"));
      absl::Status status = (*mine)->RegisterModel(request, nullptr, absl::Seconds(3)).status();
      if (absl::IsResourceExhausted(status)) {
        ++refused;
        EXPECT_THAT(std::string(status.message()), HasSubstr("registrations are queued"));
      } else {
        EXPECT_THAT(status, StatusIs(absl::StatusCode::kDeadlineExceeded));
        ++timed_out;
      }
    });
  }
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(refused.load(), 4);  // 8 let in
  EXPECT_EQ(timed_out.load(), 8);
  // Once they have stopped, a registration goes through.
  stub_->SetHook(nullptr);
  Put("fine", {testing::RandomTensor("blocks.0.w", "F32", {64}, 3)});
  absl::Status registered;
  for (int attempt = 0; attempt < 50; ++attempt) {
    registered =
        client_->RegisterModel("fine", absl::StrCat("s3://", kBucket, "/fine/"), v1::GROUPING_BLOCK)
            .status();
    if (!absl::IsResourceExhausted(registered)) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_THAT(registered, IsOk());
}

// One bad answer once poisoned the cache: the chunk was kept though its read failed its check, so
// fetches failed from then on, and after the documented remedy (drop the model, register it
// again) this daemon — and the node's other daemon — served the wrong bytes.
TEST_F(RemoteHostileTest, ABadAnswerNeverStaysInTheRemoteCache) {
  const TensorSpec tensor = testing::RandomTensor("blocks.0.w", "F32", {4096}, 4);
  Put("p", {tensor});
  StartDaemon({absl::StrCat("--remote-cache-dir=", cache_dir()), "--remote-cache-bytes=64MiB"});
  const std::string url = absl::StrCat("s3://", kBucket, "/p/");
  ASSERT_THAT(client_->RegisterModel("p", url, v1::GROUPING_BLOCK), IsOk());
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  ASSERT_THAT(FetchBytes(**session, "p/blocks.0"), IsOkAndHolds(tensor.data));  // checksum kept

  // The store now answers with other bytes under the same ETag (past the header).
  std::atomic<bool> lying{true};
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    StubAnswer answer = stub_->Answer(request);
    if (lying && request.method == "GET" && !request.key.empty() && answer.body.size() > 4096) {
      for (size_t i = 1024; i < answer.body.size(); i += 7) answer.body[i] ^= 0x5a;
    }
    return answer;
  });
  const auto cached_chunks = [&] {
    size_t chunks = 0;
    for (int b = 0; b < 256; ++b) {
      char bucket[3];
      std::snprintf(bucket, sizeof(bucket), "%02x", b);
      for (const std::string& name : ListDirectory(absl::StrCat(cache_dir(), "/chunks/", bucket))
                                         .value_or(std::vector<std::string>{})) {
        chunks += name.find('.') == std::string::npos;
      }
    }
    return chunks;
  };
  const auto forget = [&] {
    // Out of the daemon's tiers, and out of the cache (as eviction would take it). The last
    // fetch's copies may still hold the host copy for a moment: evicting it is then skipped.
    const absl::Time deadline = absl::Now() + kTimeout;
    for (;;) {
      absl::StatusOr<v1::EvictResponse> evicted = client_->Evict("p/", v1::TIER_ALL);
      ASSERT_THAT(evicted, IsOk());
      if (evicted->skipped() == 0) break;
      ASSERT_LT(absl::Now(), deadline) << "p/ stayed in use";
      absl::SleepFor(absl::Milliseconds(10));
    }
    for (int b = 0; b < 256; ++b) {
      char bucket[3];
      std::snprintf(bucket, sizeof(bucket), "%02x", b);
      const std::string dir = absl::StrCat(cache_dir(), "/chunks/", bucket);
      for (const std::string& name : ListDirectory(dir).value_or(std::vector<std::string>{})) {
        ::unlink(absl::StrCat(dir, "/", name).c_str());
      }
    }
  };
  forget();
  EXPECT_THAT(FetchBytes(**session, "p/blocks.0"), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(cached_chunks(), 0u) << "a chunk whose read failed its check was kept";
  lying = false;
  EXPECT_THAT(FetchBytes(**session, "p/blocks.0"), IsOkAndHolds(tensor.data));

  // The remedy: drop the model and register it again, the store behaving again.
  forget();
  lying = true;
  EXPECT_THAT(FetchBytes(**session, "p/blocks.0"), StatusIs(absl::StatusCode::kDataLoss));
  lying = false;
  session->reset();
  ASSERT_THAT(client_->DropModel("p"), IsOk());
  ASSERT_THAT(client_->RegisterModel("p", url, v1::GROUPING_BLOCK), IsOk());
  session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  EXPECT_THAT(FetchBytes(**session, "p/blocks.0"), IsOkAndHolds(tensor.data));
  EXPECT_GT(cached_chunks(), 0u);
}

// Expired tokens, clock skew and policies still propagating pass; a 403 once marked the model
// stale until a restart.
TEST_F(RemoteHostileTest, ARefusalIsNotStaleForGood) {
  const TensorSpec tensor = testing::RandomTensor("blocks.0.w", "F32", {1024}, 5);
  Put("r", {tensor});
  StartDaemon();
  ASSERT_THAT(
      client_->RegisterModel("r", absl::StrCat("s3://", kBucket, "/r/"), v1::GROUPING_BLOCK),
      IsOk());
  std::atomic<bool> refusing{true};
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    if (refusing && request.method == "GET" && !request.key.empty()) {
      return StubAnswer::Error(403, "ExpiredToken", "The provided token has expired.");
    }
    return std::nullopt;
  });
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  EXPECT_THAT(FetchBytes(**session, "r/blocks.0"), StatusIs(absl::StatusCode::kPermissionDenied));
  absl::StatusOr<std::vector<v1::ModelSummary>> models = client_->ListModels();
  ASSERT_THAT(models, IsOk());
  ASSERT_EQ(models->size(), 1u);
  EXPECT_EQ((*models)[0].stale(), "");
  refusing = false;
  EXPECT_THAT(FetchBytes(**session, "r/blocks.0"), IsOkAndHolds(tensor.data));
}

// Shutdown waited for remote reads before it cancelled them: SIGTERM during a load from a stalled
// store ended in _Exit after the grace period.
TEST_F(RemoteHostileTest, SigtermDuringARemoteLoadEndsAtOnce) {
  Put("s", {testing::RandomTensor("blocks.0.w", "F32", {1 << 16}, 6)});
  StartDaemon({"--s3-stall-timeout-ms=60000"});
  ASSERT_THAT(
      client_->RegisterModel("s", absl::StrCat("s3://", kBucket, "/s/"), v1::GROUPING_BLOCK),
      IsOk());
  SilenceUnder("s/");
  std::thread fetching([&] {
    ClientOptions options;
    options.socket_path = socket_path();
    auto mine = Client::Connect(options);
    ASSERT_THAT(mine, IsOk());
    auto session = (*mine)->OpenSession();
    ASSERT_THAT(session, IsOk());
    EXPECT_THAT(FetchBytes(**session, "s/blocks.0"), Not(IsOk()));
  });
  absl::SleepFor(absl::Milliseconds(500));  // the GET is under way
  const absl::Time stop = absl::Now();
  EXPECT_EQ(StopDaemon(), 0);
  EXPECT_LT(absl::Now() - stop, absl::Seconds(5));
  fetching.join();
}

// `tierctl get` and `tierctl load` ignored --timeout-ms; an echoing endpoint's words reached the
// log and the operator's terminal verbatim, credentials and newlines with them.
TEST_F(RemoteHostileTest, TierctlHonoursItsTimeoutAndNoCredentialOrControlCharacterIsEchoed) {
  Put("t", {testing::RandomTensor("blocks.0.w", "F32", {1 << 18}, 7)});
  StartDaemon();
  ASSERT_THAT(
      client_->RegisterModel("t", absl::StrCat("s3://", kBucket, "/t/"), v1::GROUPING_BLOCK),
      IsOk());
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    StubAnswer answer = stub_->Answer(request);
    if (absl::StartsWith(request.key, "t/")) answer.bytes_per_second = 2000;  // a trickle
    return answer;
  });
  const std::string out = absl::StrCat(dir_.path(), "/out.bin");
  absl::Time start = absl::Now();
  testing::RunResult got = Tierctl({"--timeout-ms=1500", "get", "t/blocks.0", "-o", out});
  EXPECT_EQ(got.exit_code, 1) << got.output;
  EXPECT_THAT(got.output, HasSubstr("DEADLINE_EXCEEDED"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));
  EXPECT_TRUE(ListDirectory(dir_.path()).ok());
  for (const std::string& name : ListDirectory(dir_.path()).value_or(std::vector<std::string>{})) {
    EXPECT_FALSE(absl::StartsWith(name, "out.bin")) << name << ": a partial output left behind";
  }

  SilenceUnder("u/");
  start = absl::Now();
  testing::RunResult loaded =
      Tierctl({"--timeout-ms=1000", "load", "u", absl::StrCat("s3://", kBucket, "/u/")});
  EXPECT_EQ(loaded.exit_code, 1) << loaded.output;
  EXPECT_THAT(loaded.output, HasSubstr("DEADLINE_EXCEEDED"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));

  // An endpoint that echoes the request (its credentials among it) into its error.
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    return StubAnswer::Error(
        403, absl::StrCat("Denied\nFor ", request.Header("authorization")),
        absl::StrCat("key ", stub_->credentials().access_key_id, "\n\x1b[31msecret ",
                     stub_->credentials().secret_access_key));
  });
  testing::RunResult echoed = Tierctl({"load", "v", absl::StrCat("s3://", kBucket, "/v/")});
  EXPECT_EQ(echoed.exit_code, 1) << echoed.output;
  EXPECT_THAT(echoed.output, HasSubstr("PERMISSION_DENIED"));
  ExpectNoCredentialsIn(echoed.output, "tierctl");
  EXPECT_EQ(echoed.output.find('\x1b'), std::string::npos);
  // One line: the message's own newlines are escaped.
  EXPECT_EQ(echoed.output.find('\n'), echoed.output.size() - 1) << echoed.output;
  EXPECT_EQ(StopDaemon(), 0);
  ExpectNoCredentialsIn(Log(), "the daemon's log");
  EXPECT_THAT(Log(), HasSubstr("[credentials]"));
}

// The secret stayed in the daemon's environment (children, /proc/PID/environ) and the process
// dumpable; a plain-HTTP endpoint was taken without a word.
TEST_F(RemoteHostileTest, TheSecretsLeaveTheEnvironmentAndPlainHttpIsWarnedOf) {
  StartDaemon({},
              absl::StrCat("AWS_ACCESS_KEY_ID=", stub_->credentials().access_key_id,
                           " AWS_SECRET_ACCESS_KEY=", stub_->credentials().secret_access_key,
                           " AWS_SESSION_TOKEN=token-of-the-session-0123456789"),
              /*credentials_file=*/false);
  std::ifstream in(absl::StrCat("/proc/", daemon_->pid(), "/environ"));
  const std::string environ((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(environ, HasSubstr("AWS_ACCESS_KEY_ID="));  // read it, and it is there
  EXPECT_THAT(environ, Not(HasSubstr(stub_->credentials().secret_access_key)));
  EXPECT_THAT(environ, Not(HasSubstr("token-of-the-session-0123456789")));
  // Still used for requests (the store here takes any signature).
  Put("e", {testing::RandomTensor("blocks.0.w", "F32", {64}, 8)});
  EXPECT_THAT(
      client_->RegisterModel("e", absl::StrCat("s3://", kBucket, "/e/"), v1::GROUPING_BLOCK),
      IsOk());
  EXPECT_THAT(Log(), HasSubstr("is plain HTTP"));
}

}  // namespace
}  // namespace tierd
