// Registration's scan of a model in object storage, against a store that misbehaves
// (tests/s3_stub.h): keys shorter than the prefix or no URL may hold, objects without an ETag or
// answered at another version, more files than the bound are refused with a clear error — never
// a crash; a scan's memory follows the headers, not the number of files; a caller that goes away
// stops it.
#include "common/sanitizers.h"
#include "storage/model/remote_model_scan.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/s3_stub.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::tierd::testing::IsOk;
using ::tierd::testing::S3Stub;
using ::tierd::testing::StatusIs;
using ::tierd::testing::StubAnswer;
using ::tierd::testing::StubRequest;
using ::tierd::testing::StubSafetensors;

constexpr char kBucket[] = "models";

class RemoteModelScanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<S3Stub>> stub = S3Stub::Start();
    ASSERT_THAT(stub, IsOk());
    stub_ = *std::move(stub);
    absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(stub_->ClientOptions());
    ASSERT_THAT(client, IsOk());
    client_ = *std::move(client);
  }
  absl::StatusOr<ScannedModel> Scan(const std::string& prefix,
                                    const RemoteScanOptions& options = {}) {
    return ScanRemoteModel({kBucket, prefix}, *client_, nullptr, options);
  }
  // A listing page of `keys`, each `size` bytes with ETag "e".
  static StubAnswer Listing(const std::vector<std::string>& keys, uint64_t size,
                            const std::string& etag = "e") {
    StubAnswer answer;
    answer.body = "<?xml version=\"1.0\"?><ListBucketResult>";
    for (const std::string& key : keys) {
      absl::StrAppend(&answer.body, "<Contents><Key>", key, "</Key><Size>", size, "</Size><ETag>",
                      etag, "</ETag></Contents>");
    }
    answer.body += "<IsTruncated>false</IsTruncated></ListBucketResult>";
    return answer;
  }

  std::unique_ptr<S3Stub> stub_;
  std::unique_ptr<S3Client> client_;
};

TEST_F(RemoteModelScanTest, AWellBehavedStoresModelIsScanned) {
  stub_->PutObject(kBucket, "m/model-00001.safetensors", StubSafetensors({"a", "b"}, 64, 1));
  stub_->PutObject(kBucket, "m/model-00002.safetensors", StubSafetensors({"c"}, 64, 2));
  stub_->PutObject(kBucket, "m/sub/model.safetensors", StubSafetensors({"d"}, 64, 3));
  stub_->PutObject(kBucket, "m/README.md", "x");
  absl::StatusOr<ScannedModel> scanned = Scan("m");
  ASSERT_THAT(scanned, IsOk());
  EXPECT_EQ(scanned->directory, "s3://models/m");
  ASSERT_EQ(scanned->files.size(), 2u);
  EXPECT_EQ(scanned->tensors.size(), 3u);
  for (const ModelFile& file : scanned->files) EXPECT_FALSE(file.etag.empty());
}

// A key shorter than the prefix aborted the daemon (std::out_of_range on the admin thread).
TEST_F(RemoteModelScanTest, KeysOutsideThePrefixOrNoUrlMayHoldAreRefused) {
  const std::string file = StubSafetensors({"a"}, 64);
  for (const std::vector<std::string>& keys :
       std::vector<std::vector<std::string>>{{"x"}, {"m/a.safetensors", "other/b.safetensors"}}) {
    stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
      if (request.IsListing()) return Listing(keys, file.size());
      return std::nullopt;
    });
    absl::StatusOr<ScannedModel> refused = Scan("m/");
    EXPECT_THAT(refused, StatusIs(absl::StatusCode::kDataLoss)) << keys[0];
    EXPECT_THAT(refused.status().message(), HasSubstr("not under the prefix"));
  }
  // Keys a registered URL may not be: refused at registration, not at the first fetch.
  for (const std::string& key : {std::string("m/a\x01.safetensors"),
                                 absl::StrCat("m/", std::string(1100, 'k'), ".safetensors")}) {
    stub_->PutObject(kBucket, key, file);
    stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
      if (request.IsListing()) return Listing({key}, file.size());
      return std::nullopt;
    });
    absl::StatusOr<ScannedModel> refused = Scan("m/");
    EXPECT_THAT(refused, StatusIs(absl::StatusCode::kDataLoss)) << key.size();
    EXPECT_THAT(refused.status().message(), HasSubstr("no key tierd reads"));
  }
}

TEST_F(RemoteModelScanTest, AnObjectWithoutAnETagOrOfAnotherVersionIsRefused) {
  const std::string file = StubSafetensors({"a"}, 64);
  stub_->PutObject(kBucket, "m/a.safetensors", file, "listed-etag");
  // Listed without an ETag, and HEAD has none either.
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    if (request.IsListing()) return Listing({"m/a.safetensors"}, file.size(), "");
    if (request.method == "HEAD") {
      StubAnswer answer;
      answer.headers = {{"Content-Length", absl::StrCat(file.size())}};
      return answer;
    }
    return std::nullopt;
  });
  absl::StatusOr<ScannedModel> refused = Scan("m/");
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(refused.status().message(), HasSubstr("no ETag"));

  // Listed at one version, read at another (an endpoint ignoring If-Match): it changed.
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    if (request.IsListing()) return Listing({"m/a.safetensors"}, file.size(), "listed-etag");
    StubAnswer answer;
    answer.headers = {{"ETag", "\"another\""}};
    answer.body = file;
    return answer;
  });
  refused = Scan("m/");
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(refused.status().message(), HasSubstr("changed while it was being registered"));
}

TEST_F(RemoteModelScanTest, AModelOfMoreFilesThanTheBoundIsRefusedBeforeAnyIsRead) {
  std::vector<std::string> keys;
  for (int i = 0; i < 11; ++i) keys.push_back(absl::StrCat("m/part-", 100 + i, ".safetensors"));
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    if (request.IsListing()) return Listing(keys, 1000);
    return std::nullopt;
  });
  RemoteScanOptions options;
  options.max_files = 10;
  const int before = stub_->requests();
  absl::StatusOr<ScannedModel> refused = Scan("m/", options);
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(refused.status().message(), HasSubstr("11 files; at most 10"));
  EXPECT_EQ(stub_->requests() - before, 1);  // the listing only
}

// The peak resident memory of this process (VmHWM), in KiB; -1 when unknown.
int64_t PeakResidentKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      int64_t kib = -1;
      return absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(6, line.size() - 9)), &kib)
                 ? kib
                 : -1;
    }
  }
  return -1;
}

// The first 256 KiB of every listed file were held until every header had been read: 8,000
// files took 2.2 GB. Each header is parsed as its bytes come, and the bytes held at once are
// bounded.
TEST_F(RemoteModelScanTest, AScansMemoryFollowsItsHeadersNotItsFiles) {
#if TIERD_UNDER_ASAN || TIERD_UNDER_TSAN
  GTEST_SKIP() << "a sanitizer's quarantine and shadow memory: the peak says little";
#endif
  constexpr int kFiles = 1200;  // 300 MB of first reads, held together before
  std::vector<std::string> keys;
  for (int i = 0; i < kFiles; ++i) {
    keys.push_back(absl::StrCat("m/part-", 10000 + i, ".safetensors"));
  }
  // Each file: a small header naming a tensor of its own, then a MiB of tensor bytes a scan
  // never reads. Every file is listed at the same size: its header's name is as long.
  const auto header_of = [](const std::string& key) {
    const std::string header = absl::StrCat("{\"", key.substr(2, 10),
                                            "\":{\"dtype\":\"U8\",\"shape\":[1048576],"
                                            "\"data_offsets\":[0,1048576]}}");
    std::string bytes(8, '\0');
    for (int b = 0; b < 8; ++b) bytes[b] = static_cast<char>((header.size() >> (8 * b)) & 0xff);
    return bytes + header;
  };
  const uint64_t size = header_of(keys[0]).size() + (1 << 20);
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    if (request.IsListing()) return Listing(keys, size);
    StubAnswer answer;
    answer.status = 206;
    answer.headers = {{"ETag", "\"e\""},
                      {"Content-Range", absl::StrCat("bytes 0-", (256 << 10) - 1, "/", size)}};
    answer.body = header_of(request.key);
    answer.body.resize(256 << 10, '\0');
    return answer;
  });
  // The peak from here on.
  if (std::ofstream clear("/proc/self/clear_refs"); clear) clear << "5";
  const int64_t before = PeakResidentKiB();
  absl::StatusOr<ScannedModel> scanned = Scan("m/");
  ASSERT_THAT(scanned, IsOk());
  EXPECT_EQ(scanned->files.size(), static_cast<size_t>(kFiles));
  const int64_t grown = PeakResidentKiB() - before;
  // The stub's own answers (16 readers' worth) and the parsed headers, not 300 MB of first reads.
  EXPECT_LT(grown, 96 * 1024) << "KiB";
  RecordProperty("peak_growth_kib", static_cast<int>(grown));
}

TEST_F(RemoteModelScanTest, ACallerThatGoesAwayStopsTheScan) {
  std::vector<std::string> keys;
  for (int i = 0; i < 40; ++i) keys.push_back(absl::StrCat("m/part-", 100 + i, ".safetensors"));
  std::atomic<int> reads{0};
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    if (request.IsListing()) return Listing(keys, 1000);
    ++reads;
    StubAnswer answer;
    answer.silence = absl::Seconds(20);  // a silent store
    return answer;
  });
  std::atomic<bool> gone{false};
  RemoteScanOptions options;
  options.cancelled = &gone;
  std::thread leave([&] {
    absl::SleepFor(absl::Milliseconds(300));
    gone = true;
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<ScannedModel> scanned = Scan("m/", options);
  leave.join();
  EXPECT_THAT(scanned, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_LE(reads.load(), 16);  // the ones under way; none started after
}

}  // namespace
}  // namespace tierd
