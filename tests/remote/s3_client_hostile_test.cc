// The S3 client against a store that misbehaves (tests/s3_stub.h, on loopback): an endless or
// cut listing, keys outside the prefix, another version's bytes, a whole object for a range, one
// byte at a time, a trickle, error text echoing the credentials, a refusal until the credentials
// rotate, a certificate the given CA did not sign. Each is refused, bounded or mended as
// remote/s3_client.h says, and the client's memory and time stay bounded.
#include <sys/wait.h>

#include <atomic>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "remote/detail/s3_checksum.h"
#include "remote/s3_client.h"
#include "tests/s3_stub.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::tierd::testing::IsOk;
using ::tierd::testing::PatternBytes;
using ::tierd::testing::S3Stub;
using ::tierd::testing::StatusIs;
using ::tierd::testing::StubAnswer;
using ::tierd::testing::StubRequest;

constexpr char kBucket[] = "models";

class S3ClientHostileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<S3Stub>> stub = S3Stub::Start();
    ASSERT_THAT(stub, IsOk());
    stub_ = *std::move(stub);
    Connect(stub_->ClientOptions());
  }
  void Connect(S3ClientOptions options) {
    absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(std::move(options));
    ASSERT_THAT(client, IsOk());
    client_ = *std::move(client);
  }
  absl::StatusOr<std::string> Read(const std::string& key, uint64_t offset, uint64_t length,
                                   ObjectReadOptions read = {}) {
    std::string bytes(length, '\0');
    absl::Status status = client_->ReadRange({kBucket, key}, offset, length,
                                             reinterpret_cast<uint8_t*>(bytes.data()), read);
    if (!status.ok()) return status;
    return bytes;
  }
  // A ListObjectsV2 page of `keys`, truncated with `token` when it is not empty.
  static StubAnswer Page(const std::vector<std::string>& keys, const std::string& token = "") {
    StubAnswer answer;
    answer.body = "<?xml version=\"1.0\"?><ListBucketResult>";
    for (const std::string& key : keys) {
      absl::StrAppend(&answer.body, "<Contents><Key>", key,
                      "</Key><Size>1</Size><ETag>&quot;e&quot;</ETag></Contents>");
    }
    absl::StrAppend(
        &answer.body, "<IsTruncated>", token.empty() ? "false" : "true", "</IsTruncated>",
        token.empty() ? ""
                      : absl::StrCat("<NextContinuationToken>", token, "</NextContinuationToken>"),
        "</ListBucketResult>");
    return answer;
  }

  std::unique_ptr<S3Stub> stub_;
  std::unique_ptr<S3Client> client_;
};

// A store that answers "truncated" for ever once grew the daemon ~150 MB/s until bad_alloc.
TEST_F(S3ClientHostileTest, AnEndlessListingIsRefusedAfterItsPageBound) {
  std::atomic<int> pages{0};
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    if (!request.IsListing()) return std::nullopt;
    const int page = pages++;
    return Page({absl::StrCat("m/", page, ".bin")}, absl::StrCat("token-", page));
  });
  absl::StatusOr<std::vector<ListedObject>> listed = client_->List(kBucket, "m/");
  EXPECT_THAT(listed, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(listed.status().message(), HasSubstr("more than 64 pages"));
  EXPECT_EQ(pages.load(), 64);

  // A token seen before ends it at once.
  pages = 0;
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    if (!request.IsListing()) return std::nullopt;
    ++pages;
    return Page({"m/a.bin"}, "the-same-token");
  });
  listed = client_->List(kBucket, "m/");
  EXPECT_THAT(listed, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(listed.status().message(), HasSubstr("repeated a continuation token"));
  EXPECT_EQ(pages.load(), 2);
}

TEST_F(S3ClientHostileTest, AListingIsBoundedInObjectsAndBytesAndNeverTakenCut) {
  ListLimits limits;
  limits.max_objects = 5;
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    if (!request.IsListing()) return std::nullopt;
    return Page({"m/1", "m/2", "m/3", "m/4", "m/5", "m/6"});
  });
  absl::StatusOr<std::vector<ListedObject>> listed = client_->List(kBucket, "m/", limits);
  EXPECT_THAT(listed, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(listed.status().message(), HasSubstr("more than 5 objects"));

  // A page over 8 MiB was cut at 8 MiB and taken as the whole listing.
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    if (!request.IsListing()) return std::nullopt;
    StubAnswer answer = Page({"m/a.bin"});
    answer.body.insert(answer.body.find("<Contents>"), std::string(9 << 20, ' '));
    return answer;
  });
  listed = client_->List(kBucket, "m/");
  EXPECT_THAT(listed, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(listed.status().message(), HasSubstr("refused, not cut"));

  // Pages together past the byte bound.
  limits = ListLimits();
  limits.max_bytes = 64 << 10;
  std::atomic<int> page{0};
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    if (!request.IsListing()) return std::nullopt;
    StubAnswer answer = Page({absl::StrCat("m/", page.load())}, absl::StrCat("t", page++));
    answer.body.insert(answer.body.find("<Contents>"), std::string(20 << 10, ' '));
    return answer;
  });
  listed = client_->List(kBucket, "m/", limits);
  EXPECT_THAT(listed, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(listed.status().message(), HasSubstr("more than 65536 bytes"));
  EXPECT_EQ(page.load(), 4);

  // Something else than a listing.
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    if (!request.IsListing()) return std::nullopt;
    StubAnswer answer;
    answer.body = "<html>a proxy's page</html>";
    return answer;
  });
  EXPECT_THAT(client_->List(kBucket, "m/"), StatusIs(absl::StatusCode::kDataLoss));
}

// A key shorter than the prefix once aborted the daemon (an unchecked substr).
TEST_F(S3ClientHostileTest, KeysOutsideThePrefixAreRefusedAndDeeperOnesLeftOut) {
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    if (!request.IsListing()) return std::nullopt;
    return Page({"m/a.bin", "x"});
  });
  absl::StatusOr<std::vector<ListedObject>> listed = client_->List(kBucket, "models/m/");
  EXPECT_THAT(listed, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(listed.status().message(), HasSubstr("not under the prefix"));

  // A store that ignores the delimiter lists what is further down: not this directory's.
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    if (!request.IsListing()) return std::nullopt;
    EXPECT_EQ(request.query.at("delimiter"), "/");
    return Page({"m/a.bin", "m/sub/b.bin", "m/z.bin"});
  });
  listed = client_->List(kBucket, "m/");
  ASSERT_THAT(listed, IsOk());
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].key, "m/a.bin");
  EXPECT_EQ((*listed)[1].key, "m/z.bin");
}

// An endpoint (or a proxy) that ignores If-Match had its other bytes served as the model's.
TEST_F(S3ClientHostileTest, AnAnswerOfAnotherVersionOrOfNoneIsRefused) {
  const std::string v1 = PatternBytes(4096, 1);
  const std::string etag = stub_->PutObject(kBucket, "m/w.bin", v1);
  ObjectReadOptions read;
  read.etag = etag;
  EXPECT_EQ(Read("m/w.bin", 0, 4096, read).value_or(""), v1);

  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    StubAnswer answer;  // version 2, whatever If-Match says
    answer.status = 206;
    answer.headers = {{"ETag", "\"v2\""}, {"Content-Range", "bytes 0-4095/4096"}};
    answer.body = PatternBytes(4096, 2);
    EXPECT_EQ(request.Header("if-match"), absl::StrCat("\"", etag, "\""));
    return answer;
  });
  absl::StatusOr<std::string> other = Read("m/w.bin", 0, 4096, read);
  EXPECT_THAT(other, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(other.status().message(), HasSubstr("the answer is of ETag \"v2\""));

  // No ETag at all: no telling which version the bytes are.
  stub_->SetHook([&](const StubRequest&) -> std::optional<StubAnswer> {
    StubAnswer answer;
    answer.status = 206;
    answer.headers = {{"Content-Range", "bytes 0-4095/4096"}};
    answer.body = v1;
    return answer;
  });
  EXPECT_THAT(Read("m/w.bin", 0, 4096, read), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(Read("m/w.bin", 0, 4096), StatusIs(absl::StatusCode::kDataLoss));
}

// Behind a proxy that strips Range, each part once read the object from its start.
TEST_F(S3ClientHostileTest, AWholeObjectAnsweredToARangeIsRefusedAtOnce) {
  const std::string bytes = PatternBytes(1 << 20, 3);
  const std::string etag = stub_->PutObject(kBucket, "m/w.bin", bytes);
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    StubRequest stripped = request;
    stripped.headers.erase("range");
    return stub_->Answer(stripped);
  });
  const int before = stub_->requests();
  absl::StatusOr<std::string> read = Read("m/w.bin", 4096, 8192);
  EXPECT_THAT(read, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(read.status().message(), HasSubstr("whole object"));
  EXPECT_EQ(stub_->requests() - before, 1);  // not retried
  // Asked for the whole object, the whole object is the answer.
  ObjectReadOptions whole;
  whole.etag = etag;
  whole.object_size = bytes.size();
  EXPECT_TRUE(Read("m/w.bin", 0, bytes.size(), whole).value_or("") == bytes);
}

TEST_F(S3ClientHostileTest, AWholeObjectIsCheckedAgainstTheStoresChecksum) {
  const std::string bytes = "123456789";
  const std::string etag = stub_->PutObject(kBucket, "m/c.bin", bytes);
  std::string header, value;
  std::atomic<bool> ranged{false};
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    ranged = !request.Header("range").empty();
    EXPECT_EQ(request.Header("x-amz-checksum-mode"), "ENABLED");
    StubAnswer answer = stub_->Answer(request);
    answer.headers.emplace_back(header, value);
    return answer;
  });
  ObjectReadOptions whole;
  whole.etag = etag;
  whole.object_size = bytes.size();
  for (const auto& [name, right] : std::vector<std::pair<std::string, std::string>>{
           {"x-amz-checksum-crc32", "y/Q5Jg=="},
           {"x-amz-checksum-crc32c", "4waSgw=="},
           {"x-amz-checksum-crc64nvme", "rosUhgp5mIg="},
           {"x-amz-checksum-sha1", "98O8HYCOBHMq32eZZczDTKeuNEE="},
           {"x-amz-checksum-sha256", "FeKw08M4keuw8e9gnsQZQgwg4yDOlMZfvIwzEkSOsiU="}}) {
    header = name;
    value = right;
    EXPECT_EQ(Read("m/c.bin", 0, bytes.size(), whole).value_or(""), bytes) << name;
    EXPECT_FALSE(ranged) << name;
    value = "AAAAAA==";
    absl::StatusOr<std::string> refused = Read("m/c.bin", 0, bytes.size(), whole);
    EXPECT_THAT(refused, StatusIs(absl::StatusCode::kDataLoss)) << name;
    EXPECT_THAT(refused.status().message(), HasSubstr("checksum the store keeps")) << name;
  }
  // A multipart upload's composite checksum says nothing of one answer's bytes: not checked.
  header = "x-amz-checksum-crc32c";
  value = "AAAAAA==-3";
  EXPECT_THAT(Read("m/c.bin", 0, bytes.size(), whole), IsOk());
  // Nor does a range's answer carry one.
  value = "AAAAAA==";
  EXPECT_THAT(Read("m/c.bin", 1, 3, whole), IsOk());
  EXPECT_TRUE(ranged);
}

TEST(S3ChecksumTest, KnownValuesOfEveryAlgorithm) {
  const std::string bytes = "123456789";
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  EXPECT_EQ(ComputeS3Checksum("crc32", data, bytes.size()), "y/Q5Jg==");
  EXPECT_EQ(ComputeS3Checksum("crc32c", data, bytes.size()), "4waSgw==");
  EXPECT_EQ(ComputeS3Checksum("crc64nvme", data, bytes.size()), "rosUhgp5mIg=");
  EXPECT_EQ(ComputeS3Checksum("sha1", data, bytes.size()), "98O8HYCOBHMq32eZZczDTKeuNEE=");
  EXPECT_EQ(ComputeS3Checksum("sha256", data, bytes.size()),
            "FeKw08M4keuw8e9gnsQZQgwg4yDOlMZfvIwzEkSOsiU=");
  EXPECT_EQ(ComputeS3Checksum("md5", data, bytes.size()), "");
  EXPECT_FALSE(ParseS3ChecksumHeader("x-amz-checksum-type", "FULL_OBJECT").has_value());
  EXPECT_FALSE(ParseS3ChecksumHeader("x-amz-checksum-crc32", "abc=-2").has_value());
  EXPECT_TRUE(ParseS3ChecksumHeader("x-amz-checksum-crc32", "abc=").has_value());
}

// One byte per answer once made 1,012 GETs in 55 s without ever running out of attempts.
TEST_F(S3ClientHostileTest, AnswersOfAByteAtATimeRunOutOfAttempts) {
  stub_->PutObject(kBucket, "m/w.bin", PatternBytes(1 << 20, 4));
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    StubAnswer answer = stub_->Answer(request);
    answer.close_after_bytes = 1;
    return answer;
  });
  const int before = stub_->requests();
  absl::StatusOr<std::string> read = Read("m/w.bin", 0, 1 << 20);
  EXPECT_THAT(read, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(read.status().message(), HasSubstr("without progress"));
  EXPECT_LE(stub_->requests() - before, 2);  // --s3-attempts (2 here)
}

// 1.5 KB/s passes the stall check (under 1 KiB/s for stall_timeout) and once held a part for ever.
TEST_F(S3ClientHostileTest, ATrickleEndsAtTheCallsDeadline) {
  stub_->PutObject(kBucket, "m/w.bin", PatternBytes(1 << 20, 5));
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    StubAnswer answer = stub_->Answer(request);
    answer.bytes_per_second = 1500;
    return answer;
  });
  S3ClientOptions options = stub_->ClientOptions();
  options.call_timeout = absl::Seconds(2);
  Connect(options);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> read = Read("m/w.bin", 0, 1 << 20);
  EXPECT_THAT(read, StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(1900));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  // The caller's own deadline, when sooner.
  ObjectReadOptions sooner;
  sooner.deadline = absl::Now() + absl::Milliseconds(500);
  EXPECT_THAT(Read("m/w.bin", 0, 1 << 20, sooner), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_LT(absl::Now() - sooner.deadline, absl::Seconds(3));
}

TEST_F(S3ClientHostileTest, ACallerThatGoesAwayEndsItsCallOnly) {
  stub_->PutObject(kBucket, "m/w.bin", PatternBytes(1 << 20, 6));
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    StubAnswer answer = stub_->Answer(request);
    if (!request.key.empty()) answer.silence = absl::Seconds(30);
    return answer;
  });
  std::atomic<bool> gone{false};
  ObjectReadOptions read;
  read.cancelled = &gone;
  std::thread leaving([&] {
    absl::SleepFor(absl::Milliseconds(300));
    gone = true;
  });
  const absl::Time start = absl::Now();
  EXPECT_THAT(Read("m/w.bin", 0, 4096, read), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  leaving.join();
  stub_->SetHook(nullptr);
  EXPECT_THAT(Read("m/w.bin", 0, 4096), IsOk());  // the client goes on
}

// An echoing endpoint's <Code> and <Message> once put the key id and the session token in the
// daemon's log and the client's error, and their newlines on the operator's terminal.
TEST_F(S3ClientHostileTest, TheStoresWordsAreQuotedBoundedAndNeverEchoCredentials) {
  S3ClientOptions options = stub_->ClientOptions();
  options.credentials.session_token = "FwoGZXIvYXdzEXAMPLESESSIONTOKEN0123456789";
  Connect(options);
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    return StubAnswer::Error(
        403, absl::StrCat("Denied\n", options.credentials.access_key_id),
        absl::StrCat("token ", request.Header("x-amz-security-token"), "\nkey ",
                     request.Header("authorization"), "\x1b[2J", std::string(100000, 'x')));
  });
  absl::StatusOr<std::string> read = Read("m/w.bin", 0, 16);
  ASSERT_THAT(read, StatusIs(absl::StatusCode::kPermissionDenied));
  const std::string message(read.status().message());
  for (const std::string& secret :
       {options.credentials.access_key_id, options.credentials.secret_access_key,
        options.credentials.session_token}) {
    EXPECT_THAT(message, Not(HasSubstr(secret)));
  }
  EXPECT_THAT(message, HasSubstr("[credentials]"));
  EXPECT_EQ(message.find('\n'), std::string::npos);
  EXPECT_EQ(message.find('\x1b'), std::string::npos);
  EXPECT_LT(message.size(), 1024u);
}

// An expired token or a rotated key once marked models stale for good: the client looks for the
// credentials again and retries with them.
TEST_F(S3ClientHostileTest, ARefusalIsRetriedWithCredentialsFoundAgain) {
  const std::string bytes = PatternBytes(4096, 7);
  stub_->PutObject(kBucket, "m/w.bin", bytes);
  std::atomic<int> refreshes{0};
  S3ClientOptions options = stub_->ClientOptions();
  S3Credentials rotated = options.credentials;
  rotated.access_key_id = "AKIAROTATEDKEY000000";
  options.refresh_credentials = [&]() -> absl::StatusOr<S3Credentials> {
    ++refreshes;
    return rotated;
  };
  Connect(options);
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    if (!absl::StrContains(request.Header("authorization"), rotated.access_key_id)) {
      return StubAnswer::Error(403, "ExpiredToken", "the provided token has expired");
    }
    return std::nullopt;
  });
  EXPECT_EQ(Read("m/w.bin", 0, 4096).value_or(""), bytes);
  EXPECT_EQ(refreshes.load(), 1);
  EXPECT_EQ(Read("m/w.bin", 0, 4096).value_or(""), bytes);  // signed with them from now on
  EXPECT_EQ(refreshes.load(), 1);

  // Found again and still refused: the refusal stands (the next call may ask again).
  rotated.access_key_id = "AKIANOTACCEPTED00000";
  stub_->SetHook([&](const StubRequest&) -> std::optional<StubAnswer> {
    return StubAnswer::Error(403, "AccessDenied", "no");
  });
  absl::SleepFor(absl::Milliseconds(1100));  // refreshes are at most once a second
  absl::StatusOr<std::string> refused = Read("m/w.bin", 0, 4096);
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(refused.status().message(), HasSubstr("AccessDenied"));
}

// The client's deadline bounds a listing and a HEAD too.
TEST_F(S3ClientHostileTest, ASilentStoreIsBoundedInEveryCall) {
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    StubAnswer answer = stub_->Answer(request);
    answer.silence = absl::Seconds(60);
    return answer;
  });
  S3ClientOptions options = stub_->ClientOptions();
  options.stall_timeout = absl::Seconds(30);
  options.call_timeout = absl::Seconds(1);
  Connect(options);
  const absl::Time start = absl::Now();
  EXPECT_THAT(client_->List(kBucket, "m/"), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(client_->Head({kBucket, "m/w.bin"}), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

// A throwaway CA of the "system" store (standing in for a publicly trusted one) signs the
// endpoint's certificate; the operator's --s3-ca-file names another CA. The given CA must be the
// only trust: the system's directory of CAs once stayed set beside it.
TEST(S3ClientTlsTest, TheGivenCaIsTheOnlyTrust) {
  testing::TempDir dir;
  const std::string d = dir.path();
  const auto run = [&](const std::vector<std::string>& argv) {
    absl::StatusOr<testing::RunResult> result =
        testing::RunProgramWithStderr(argv, absl::Seconds(60));
    ASSERT_THAT(result, IsOk());
    ASSERT_EQ(result->exit_code, 0) << argv[0] << " " << argv[1] << ": " << result->output;
  };
  for (const char* ca : {"ca-private", "ca-public"}) {
    run({"openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "2", "-subj", absl::StrCat("/CN=tierd test ", ca), "-keyout",
         absl::StrCat(d, "/", ca, ".key"), "-out", absl::StrCat(d, "/", ca, ".pem")});
  }
  run({"openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
       "-subj", "/CN=127.0.0.1", "-keyout", d + "/server.key", "-out", d + "/server.csr"});
  std::ofstream(d + "/san.ext") << "subjectAltName=IP:127.0.0.1\n";
  run({"openssl", "x509", "-req", "-in", d + "/server.csr", "-CA", d + "/ca-public.pem", "-CAkey",
       d + "/ca-public.key", "-CAcreateserial", "-days", "2", "-extfile", d + "/san.ext", "-out",
       d + "/server.pem"});
  run({"mkdir", d + "/system"});
  run({"cp", d + "/ca-public.pem", d + "/system/"});
  run({"openssl", "rehash", d + "/system"});

  // A TLS endpoint with the certificate the "public" CA signed.
  int port = 0;
  std::unique_ptr<testing::Subprocess> server;
  for (int attempt = 0; attempt < 5 && server == nullptr; ++attempt) {
    absl::StatusOr<std::unique_ptr<S3Stub>> probe = S3Stub::Start();  // a free port, let go
    ASSERT_THAT(probe, IsOk());
    port = std::stoi((*probe)->endpoint().url.substr((*probe)->endpoint().url.rfind(':') + 1));
    probe->reset();
    absl::StatusOr<std::unique_ptr<testing::Subprocess>> started = testing::Subprocess::Start(
        {"/usr/bin/openssl", "s_server", "-quiet", "-www", "-accept",
         absl::StrCat("127.0.0.1:", port), "-cert", d + "/server.pem", "-key", d + "/server.key"});
    ASSERT_THAT(started, IsOk());
    absl::SleepFor(absl::Milliseconds(500));
    if (::waitpid((*started)->pid(), nullptr, WNOHANG) == 0) server = *std::move(started);
  }
  ASSERT_NE(server, nullptr);
  const auto read_through = [&](const std::string& ca_file) {
    S3ClientOptions options;
    options.endpoint.url = absl::StrCat("https://127.0.0.1:", port);
    options.credentials.access_key_id = "AKIATLSTEST000000000";
    options.credentials.secret_access_key = "secret-of-the-tls-test";
    options.system_ca_path = d + "/system";
    options.ca_file = ca_file;
    options.max_attempts = 1;
    options.call_timeout = absl::Seconds(10);
    absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(options);
    EXPECT_THAT(client, IsOk());
    uint8_t byte;
    return (*client)->ReadRange({kBucket, "m/w.bin"}, 0, 1, &byte);
  };
  // The system's store trusts the endpoint: the handshake passes (what the HTTP answer is does
  // not matter here).
  const absl::Status system = read_through("");
  EXPECT_THAT(std::string(system.message()), Not(HasSubstr("certificate"))) << system;
  // With the operator's CA, only it: the same endpoint is refused, at once.
  const absl::Status pinned = read_through(d + "/ca-private.pem");
  EXPECT_THAT(pinned, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(std::string(pinned.message()), HasSubstr("certificate"));
}

}  // namespace
}  // namespace tierd
