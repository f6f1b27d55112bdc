// The remote reader's scheduling over a store in memory (tests/fake_object_store.h): parts go
// demand first, then by deadline, then in the order they came; a request none of whose parts
// started is cancelled and one under way is not; a queued request is moved by a reprioritization;
// an object changed since registration fails its read; a store that fails mid-object fails the
// request and the parts not started are dropped.
#include <atomic>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/io/remote_reader.h"
#include "tests/fake_object_store.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::FakeObjectStore;
using ::tierd::testing::IsOk;
using ::tierd::testing::PatternBytes;
using ::tierd::testing::StatusIs;

constexpr uint64_t kPart = 4096;

class RemoteReaderOrderTest : public ::testing::Test {
 protected:
  // A reader of one stream over the store, parts of kPart bytes.
  void SetUp() override {
    for (const char* key : {"a", "b", "c"}) AddFile(key, 4 * kPart, key[0]);
    RemoteReaderOptions options;
    options.streams = 1;
    options.part_bytes = kPart;
    absl::StatusOr<std::unique_ptr<RemoteReader>> reader = RemoteReader::Create(store_, options);
    ASSERT_THAT(reader, IsOk());
    reader_ = *std::move(reader);
  }
  void TearDown() override {
    store_.Release();
    reader_.reset();
  }

  void AddFile(const std::string& key, uint64_t size, int seed) {
    bytes_[key] = PatternBytes(size, seed);
    ModelFile& file = files_[key];
    file.path = absl::StrCat("s3://models/", key);
    file.size = size;
    file.object = S3Url{"models", key};
    file.etag = store_.Put("models", key, bytes_[key]);
  }

  // A read of all of `key`, answered into outcomes_[name].
  RemoteReader::RequestId Submit(const std::string& name, const std::string& key,
                                 ReadPriority priority,
                                 absl::Time deadline = absl::InfiniteFuture()) {
    out_[name] = std::string(files_[key].size, '\0');
    ReadRequest request;
    request.targets.push_back(ReadTarget{files_[key].path, 0, files_[key].size,
                                         reinterpret_cast<uint8_t*>(out_[name].data()), false,
                                         &files_[key]});
    request.priority = priority;
    request.deadline = deadline;
    request.done = [this, name](absl::Status status) {
      outcomes_[name] = std::move(status);
      done_[name].Notify();
    };
    return reader_->Submit(std::move(request));
  }
  absl::Status Outcome(const std::string& name) {
    EXPECT_TRUE(done_[name].WaitForNotificationWithTimeout(absl::Seconds(10))) << name;
    return outcomes_[name];
  }
  // The keys of the reads the store was asked for, in order.
  std::string Order() const {
    std::string order;
    for (const FakeObjectStore::Read& read : store_.reads()) order += read.key;
    return order;
  }

  FakeObjectStore store_;
  std::map<std::string, std::string> bytes_;
  std::map<std::string, ModelFile> files_;
  std::map<std::string, std::string> out_;
  std::map<std::string, absl::Status> outcomes_;
  std::map<std::string, absl::Notification> done_;
  std::unique_ptr<RemoteReader> reader_;
};

TEST_F(RemoteReaderOrderTest, PartsGoDemandFirstThenByDeadlineThenInTheirOrder) {
  store_.Hold();
  Submit("first", "a", ReadPriority::kPrefetch);  // its first part takes the one stream
  ASSERT_TRUE(store_.AwaitReads(1));
  const absl::Time now = absl::Now();
  Submit("late", "b", ReadPriority::kPrefetch, now + absl::Seconds(20));
  Submit("soon", "c", ReadPriority::kPrefetch, now + absl::Seconds(10));
  Submit("demand", "b", ReadPriority::kDemand);
  store_.Release();
  for (const char* name : {"first", "late", "soon", "demand"}) EXPECT_THAT(Outcome(name), IsOk());
  // a's first part, then the demand (b), the sooner deadline (c), the later one (b), the rest of a.
  EXPECT_EQ(Order(), "abbbbccccbbbbaaa");
  EXPECT_EQ(out_["soon"], bytes_["c"]);
  EXPECT_EQ(out_["demand"], bytes_["b"]);
}

TEST_F(RemoteReaderOrderTest, AQueuedRequestIsCancelledAndOneUnderWayIsNot) {
  store_.Hold();
  const RemoteReader::RequestId under_way = Submit("under way", "a", ReadPriority::kPrefetch);
  ASSERT_TRUE(store_.AwaitReads(1));
  const RemoteReader::RequestId queued = Submit("queued", "b", ReadPriority::kPrefetch);
  EXPECT_TRUE(reader_->Cancel(queued));
  EXPECT_TRUE(done_["queued"].HasBeenNotified());  // answered in Cancel
  EXPECT_THAT(outcomes_["queued"], StatusIs(absl::StatusCode::kCancelled));
  EXPECT_FALSE(reader_->Cancel(under_way));
  EXPECT_FALSE(reader_->Cancel(queued));  // known no more
  store_.Release();
  EXPECT_THAT(Outcome("under way"), IsOk());
  EXPECT_EQ(out_["under way"], bytes_["a"]);
  EXPECT_EQ(Order(), "aaaa");
  EXPECT_EQ(reader_->stats().requests_cancelled, 1u);
}

TEST_F(RemoteReaderOrderTest, ReprioritizingMovesAQueuedRequestAhead) {
  store_.Hold();
  Submit("first", "a", ReadPriority::kPrefetch);
  ASSERT_TRUE(store_.AwaitReads(1));
  Submit("b", "b", ReadPriority::kPrefetch);
  const RemoteReader::RequestId c = Submit("c", "c", ReadPriority::kPrefetch);
  EXPECT_TRUE(reader_->Reprioritize(c, ReadPriority::kDemand, absl::InfiniteFuture()));
  store_.Release();
  for (const char* name : {"first", "b", "c"}) EXPECT_THAT(Outcome(name), IsOk());
  EXPECT_EQ(Order(), "accccaaabbbb");
  EXPECT_FALSE(reader_->Reprioritize(c, ReadPriority::kPrefetch, absl::InfiniteFuture()));
}

TEST_F(RemoteReaderOrderTest, AnObjectChangedSinceRegistrationFailsItsRead) {
  store_.Put("models", "a", PatternBytes(4 * kPart, 9));  // a new version; files_ has the old
  Submit("changed", "a", ReadPriority::kDemand);
  EXPECT_THAT(Outcome("changed"), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(RemoteReaderOrderTest, AStoreThatFailsMidObjectFailsTheRequestAndDropsTheRest) {
  AddFile("long", 16 * kPart, 7);
  store_.FailPast("long", 3 * kPart);  // its fourth part fails
  Submit("long", "long", ReadPriority::kDemand);
  absl::Status outcome = Outcome("long");
  EXPECT_THAT(outcome, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(std::string(outcome.message()), ::testing::HasSubstr("mid-object"));
  EXPECT_EQ(store_.reads().size(), 4u);  // one stream: the parts after the failure never went
  EXPECT_EQ(reader_->stats().requests_failed, 1u);
  // The reader goes on.
  Submit("after", "b", ReadPriority::kDemand);
  EXPECT_THAT(Outcome("after"), IsOk());
  EXPECT_EQ(out_["after"], bytes_["b"]);
}

}  // namespace
}  // namespace tierd
