// The S3 client against a real gateway (Ceph's RADOS Gateway, deploy/s3-gateway.sh): sizes,
// listings (right under a prefix, every page) and byte ranges exact; missing objects, bad keys,
// changed objects and ranges past the end refused as such; a stalled or stopped gateway retried,
// then UNAVAILABLE; throttling backed off and retried; answers cut short by a proxy resumed to the
// exact bytes; a read in flight cancelled.
#include "remote/s3_client.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/s3_gateway.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::tierd::testing::IsOk;
using ::tierd::testing::PatternBytes;
using ::tierd::testing::S3Gateway;
using ::tierd::testing::StatusIs;

constexpr char kBucket[] = "tierd-client-test";

class S3ClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<S3Gateway>> gateway = S3Gateway::Start({kBucket});
    ASSERT_THAT(gateway, IsOk());
    gateway_ = gateway->release();
  }
  static void TearDownTestSuite() {
    delete gateway_;
    gateway_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(gateway_, nullptr);
    absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(gateway_->ClientOptions());
    ASSERT_THAT(client, IsOk());
    client_ = *std::move(client);
  }

  absl::StatusOr<std::string> Read(const std::string& key, uint64_t offset, uint64_t length,
                                   const std::string& if_match = "") {
    return ReadFrom(*client_, key, offset, length, if_match);
  }
  static absl::StatusOr<std::string> ReadFrom(S3Client& client, const std::string& key,
                                              uint64_t offset, uint64_t length,
                                              const std::string& if_match = "") {
    std::string bytes(length, '\0');
    ObjectReadOptions read;
    read.etag = if_match;
    absl::Status status = client.ReadRange({kBucket, key}, offset, length,
                                           reinterpret_cast<uint8_t*>(bytes.data()), read);
    if (!status.ok()) return status;
    return bytes;
  }
  // A client with the gateway's options but `endpoint` (a proxy's, the HTTPS one) and `ca_file`.
  static absl::StatusOr<std::unique_ptr<S3Client>> ClientAt(const S3Endpoint& endpoint,
                                                            const std::string& ca_file = "") {
    S3ClientOptions options = gateway_->ClientOptions();
    options.endpoint = endpoint;
    options.ca_file = ca_file;
    return S3Client::Create(options);
  }

  static S3Gateway* gateway_;
  std::unique_ptr<S3Client> client_;
};

S3Gateway* S3ClientTest::gateway_ = nullptr;

TEST_F(S3ClientTest, SizesListingsAndRangesAreExact) {
  const std::string big = PatternBytes((3 << 20) + 7, 1);
  const std::string odd = PatternBytes(4099, 2);
  ASSERT_THAT(gateway_->PutObject(kBucket, "m/a.bin", big), IsOk());
  ASSERT_THAT(gateway_->PutObject(kBucket, "m/b c+d=é.bin", odd), IsOk());
  ASSERT_THAT(gateway_->PutObject(kBucket, "m/sub/e.bin", "e"), IsOk());
  ASSERT_THAT(gateway_->PutObject(kBucket, "other/x.bin", "x"), IsOk());

  absl::StatusOr<ObjectHead> head = client_->Head({kBucket, "m/a.bin"});
  ASSERT_THAT(head, IsOk());
  EXPECT_EQ(head->size, big.size());
  EXPECT_FALSE(head->etag.empty());
  EXPECT_EQ(head->etag.find('"'), std::string::npos);
  EXPECT_FALSE(head->last_modified.empty());

  for (int page_size : {1000, 2, 1}) {  // one page, then several
    ListLimits limits;
    limits.page_size = page_size;
    absl::StatusOr<std::vector<ListedObject>> listed = client_->List(kBucket, "m/", limits);
    ASSERT_THAT(listed, IsOk()) << page_size;
    std::vector<std::string> keys;
    for (const ListedObject& object : *listed) keys.push_back(object.key);
    // Those right under the prefix: m/sub/ is a directory of its own.
    EXPECT_THAT(keys, ElementsAre("m/a.bin", "m/b c+d=é.bin")) << page_size;
    EXPECT_EQ((*listed)[0].size, big.size());
    EXPECT_EQ((*listed)[0].etag, head->etag);
  }

  EXPECT_EQ(Read("m/a.bin", 0, big.size()).value_or(""), big);
  EXPECT_EQ(Read("m/a.bin", 0, 1).value_or(""), big.substr(0, 1));
  EXPECT_EQ(Read("m/a.bin", big.size() - 1, 1).value_or(""), big.substr(big.size() - 1));
  EXPECT_EQ(Read("m/a.bin", 12345, 1 << 20).value_or(""), big.substr(12345, 1 << 20));
  EXPECT_EQ(Read("m/b c+d=é.bin", 1, 4097, head->etag).status().code(),
            absl::StatusCode::kFailedPrecondition);  // another object's ETag
  EXPECT_EQ(Read("m/b c+d=é.bin", 1, 4097).value_or(""), odd.substr(1, 4097));
  EXPECT_THAT(client_->ReadRange({kBucket, "m/a.bin"}, 5, 0, nullptr), IsOk());
  const S3ClientStats stats = client_->stats();
  EXPECT_EQ(stats.bytes_received, big.size() + 1 + 1 + (1 << 20) + 4097);
  EXPECT_EQ(stats.retries, 0u);
}

TEST_F(S3ClientTest, MissingObjectsBadKeysAndRangesPastTheEndAreRefusedAsSuch) {
  ASSERT_THAT(gateway_->PutObject(kBucket, "e/small.bin", "0123456789"), IsOk());
  EXPECT_THAT(client_->Head({kBucket, "e/none.bin"}), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(client_->Head({"no-such-bucket", "x"}), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(Read("e/none.bin", 0, 1), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(Read("e/small.bin", 10, 1), StatusIs(absl::StatusCode::kOutOfRange));
  absl::StatusOr<std::vector<ListedObject>> none = client_->List(kBucket, "e/nothing/");
  ASSERT_THAT(none, IsOk());
  EXPECT_TRUE(none->empty());

  S3ClientOptions options = gateway_->ClientOptions();
  options.credentials.secret_access_key = "not-the-secret-0123456789";
  absl::StatusOr<std::unique_ptr<S3Client>> wrong = S3Client::Create(options);
  ASSERT_THAT(wrong, IsOk());
  absl::StatusOr<ObjectHead> refused = (*wrong)->Head({kBucket, "e/small.bin"});
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kPermissionDenied));
  std::string bytes(4, '\0');
  absl::Status read =
      (*wrong)->ReadRange({kBucket, "e/small.bin"}, 0, 4, reinterpret_cast<uint8_t*>(bytes.data()));
  EXPECT_THAT(read, StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(read.message(), HasSubstr("SignatureDoesNotMatch"));
  for (const std::string& secret :
       {options.credentials.secret_access_key, gateway_->credentials().secret_access_key}) {
    EXPECT_THAT(read.message(), Not(HasSubstr(secret)));
  }
  EXPECT_THAT(read.message(), Not(HasSubstr(options.credentials.access_key_id)));
}

TEST_F(S3ClientTest, AChangedObjectIsRefusedAgainstItsOldETag) {
  ASSERT_THAT(gateway_->PutObject(kBucket, "c/w.bin", PatternBytes(8192, 3)), IsOk());
  absl::StatusOr<ObjectHead> before = client_->Head({kBucket, "c/w.bin"});
  ASSERT_THAT(before, IsOk());
  EXPECT_THAT(Read("c/w.bin", 0, 8192, before->etag), IsOk());
  ASSERT_THAT(gateway_->PutObject(kBucket, "c/w.bin", PatternBytes(8192, 4)), IsOk());
  absl::StatusOr<std::string> stale = Read("c/w.bin", 0, 8192, before->etag);
  EXPECT_THAT(stale, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(stale.status().message(), HasSubstr("changed"));
  EXPECT_EQ(Read("c/w.bin", 0, 8192).value_or(""), PatternBytes(8192, 4));
}

TEST_F(S3ClientTest, AStalledGatewayIsRetriedThenUnavailableAndWorksOnceItIsBack) {
  ASSERT_THAT(gateway_->PutObject(kBucket, "s/x.bin", PatternBytes(65536, 5)), IsOk());
  ASSERT_THAT(gateway_->Pause(), IsOk());
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> stalled = Read("s/x.bin", 0, 65536);
  const absl::Duration waited = absl::Now() - start;
  ASSERT_THAT(gateway_->Resume(), IsOk());
  EXPECT_THAT(stalled, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(stalled.status().message(), HasSubstr("3 attempts"));
  // Three attempts of a 1 s stall each, and short backoffs: not the minutes of no timeout.
  EXPECT_GE(waited, absl::Milliseconds(2500));
  EXPECT_LT(waited, absl::Seconds(30));
  EXPECT_EQ(client_->stats().retries, 2u);
  EXPECT_EQ(Read("s/x.bin", 0, 65536).value_or(""), PatternBytes(65536, 5));
}

TEST_F(S3ClientTest, AnswersCutShortAreResumedToTheExactBytes) {
  const std::string bytes = PatternBytes(3 << 20, 7);
  ASSERT_THAT(gateway_->PutObject(kBucket, "t/x.bin", bytes), IsOk());
  // Every connection is cut after 256 KiB of answer: each attempt gets further, none gets it all.
  absl::StatusOr<std::unique_ptr<testing::CuttingProxy>> proxy =
      testing::CuttingProxy::Start(gateway_->endpoint(), /*connections_to_cut=*/1000, 256 << 10);
  ASSERT_THAT(proxy, IsOk());
  absl::StatusOr<std::unique_ptr<S3Client>> client = ClientAt((*proxy)->endpoint());
  ASSERT_THAT(client, IsOk());
  absl::StatusOr<std::string> read = ReadFrom(**client, "t/x.bin", 0, bytes.size());
  ASSERT_THAT(read, IsOk());
  EXPECT_TRUE(*read == bytes);
  EXPECT_GE((*proxy)->connections_cut(), 11);
  EXPECT_GE((*client)->stats().retries, 11u);
  read = ReadFrom(**client, "t/x.bin", 1000000, 1 << 20);
  ASSERT_THAT(read, IsOk());
  EXPECT_TRUE(*read == bytes.substr(1000000, 1 << 20));
}

TEST_F(S3ClientTest, ThrottlingIsBackedOffAndRetried) {
  const std::string bytes = PatternBytes(1 << 20, 8);
  ASSERT_THAT(gateway_->PutObject(kBucket, "r/x.bin", bytes), IsOk());
  // Two answers of 503 SlowDown, then the gateway: within the client's three attempts.
  absl::StatusOr<std::unique_ptr<testing::CuttingProxy>> proxy = testing::CuttingProxy::Start(
      gateway_->endpoint(), /*connections_to_cut=*/0, 0, /*connections_to_throttle=*/2);
  ASSERT_THAT(proxy, IsOk());
  absl::StatusOr<std::unique_ptr<S3Client>> client = ClientAt((*proxy)->endpoint());
  ASSERT_THAT(client, IsOk());
  absl::StatusOr<std::string> read = ReadFrom(**client, "r/x.bin", 0, bytes.size());
  ASSERT_THAT(read, IsOk());
  EXPECT_TRUE(*read == bytes);
  EXPECT_EQ((*proxy)->connections_throttled(), 2);
  EXPECT_EQ((*client)->stats().retries, 2u);

  // Throttled past its attempts: UNAVAILABLE, saying why.
  absl::StatusOr<std::unique_ptr<testing::CuttingProxy>> busy =
      testing::CuttingProxy::Start(gateway_->endpoint(), 0, 0, /*connections_to_throttle=*/1000);
  ASSERT_THAT(busy, IsOk());
  client = ClientAt((*busy)->endpoint());
  ASSERT_THAT(client, IsOk());
  read = ReadFrom(**client, "r/x.bin", 0, bytes.size());
  EXPECT_THAT(read, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(read.status().message(), HasSubstr("SlowDown"));
}

TEST_F(S3ClientTest, HttpsIsVerifiedAgainstTheCaStoreOrTheGivenCa) {
  const std::string bytes = PatternBytes(100000, 9);
  ASSERT_THAT(gateway_->PutObject(kBucket, "h/x.bin", bytes), IsOk());
  absl::StatusOr<std::unique_ptr<S3Client>> trusting =
      ClientAt(gateway_->tls_endpoint(), gateway_->ca_file());
  ASSERT_THAT(trusting, IsOk());
  absl::StatusOr<std::string> read = ReadFrom(**trusting, "h/x.bin", 0, bytes.size());
  ASSERT_THAT(read, IsOk());
  EXPECT_TRUE(*read == bytes);

  // The system's store does not know the gateway's certificate: refused at once, not retried.
  absl::StatusOr<std::unique_ptr<S3Client>> system_store = ClientAt(gateway_->tls_endpoint());
  ASSERT_THAT(system_store, IsOk());
  absl::StatusOr<ObjectHead> refused = (*system_store)->Head({kBucket, "h/x.bin"});
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(refused.status().message(), HasSubstr("certificate"));
  EXPECT_EQ((*system_store)->stats().retries, 0u);
}

TEST_F(S3ClientTest, CancelEndsAReadInFlightAtOnce) {
  ASSERT_THAT(gateway_->PutObject(kBucket, "k/x.bin", PatternBytes(4096, 6)), IsOk());
  S3ClientOptions options = gateway_->ClientOptions();
  options.stall_timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(options);
  ASSERT_THAT(client, IsOk());
  ASSERT_THAT(gateway_->Pause(), IsOk());
  absl::Status read;
  std::thread reader([&] {
    std::string bytes(4096, '\0');
    read = (*client)->ReadRange({kBucket, "k/x.bin"}, 0, 4096,
                                reinterpret_cast<uint8_t*>(bytes.data()));
  });
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time cancelled = absl::Now();
  (*client)->Cancel();
  reader.join();
  EXPECT_LT(absl::Now() - cancelled, absl::Seconds(5));
  ASSERT_THAT(gateway_->Resume(), IsOk());
  EXPECT_THAT(read, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_THAT((*client)->Head({kBucket, "k/x.bin"}), StatusIs(absl::StatusCode::kCancelled));
}

// Last: it stops the gateway.
TEST_F(S3ClientTest, ZzAStoppedGatewayIsUnavailable) {
  ASSERT_THAT(gateway_->StopGateway(), IsOk());
  absl::SleepFor(absl::Milliseconds(200));
  absl::StatusOr<ObjectHead> head = client_->Head({kBucket, "m/a.bin"});
  EXPECT_THAT(head, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(head.status().message(), HasSubstr("connect"));
}

}  // namespace
}  // namespace tierd
