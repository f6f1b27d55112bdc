#include "tests/fake_object_store.h"

#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tierd::testing {

std::string FakeObjectStore::Put(const std::string& bucket, const std::string& key,
                                 std::string bytes) {
  absl::MutexLock lock(&mu_);
  Object& object = objects_[absl::StrCat(bucket, "/", key)];
  object.bytes = std::move(bytes);
  object.etag = absl::StrCat("v", ++versions_);
  object.fail_past.reset();
  return object.etag;
}

void FakeObjectStore::Hold() {
  absl::MutexLock lock(&mu_);
  holding_ = true;
}

void FakeObjectStore::Release() {
  absl::MutexLock lock(&mu_);
  holding_ = false;
}

bool FakeObjectStore::AwaitReads(size_t count) {
  absl::MutexLock lock(&mu_);
  const auto enough = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return reads_.size() >= count; };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
}

void FakeObjectStore::FailPast(const std::string& key, uint64_t offset) {
  absl::MutexLock lock(&mu_);
  for (auto& [name, object] : objects_) {
    if (absl::EndsWith(name, absl::StrCat("/", key))) object.fail_past = offset;
  }
}

std::vector<FakeObjectStore::Read> FakeObjectStore::reads() const {
  absl::MutexLock lock(&mu_);
  return reads_;
}

absl::StatusOr<ObjectHead> FakeObjectStore::Head(const S3Url& object) {
  absl::MutexLock lock(&mu_);
  auto it = objects_.find(absl::StrCat(object.bucket, "/", object.key));
  if (it == objects_.end()) return absl::NotFoundError(absl::StrCat(object.ToString(), ": none"));
  return ObjectHead{it->second.bytes.size(), it->second.etag, ""};
}

absl::StatusOr<std::vector<ListedObject>> FakeObjectStore::List(const std::string& bucket,
                                                                const std::string& prefix,
                                                                const ListLimits& limits,
                                                                const std::atomic<bool>*) {
  absl::MutexLock lock(&mu_);
  std::vector<ListedObject> listed;
  const std::string start = absl::StrCat(bucket, "/", prefix);
  for (auto it = objects_.lower_bound(start);
       it != objects_.end() && absl::StartsWith(it->first, start); ++it) {
    const std::string key = it->first.substr(bucket.size() + 1);
    if (key.find('/', prefix.size()) != std::string::npos) continue;
    if (listed.size() == limits.max_objects) return absl::DataLossError("too many objects");
    listed.push_back(ListedObject{key, it->second.bytes.size(), it->second.etag});
  }
  return listed;
}

absl::Status FakeObjectStore::ReadRange(const S3Url& object, uint64_t offset, uint64_t length,
                                        uint8_t* destination, const ObjectReadOptions& read) {
  absl::MutexLock lock(&mu_);
  reads_.push_back(Read{object.key, offset, length});
  mu_.Await(absl::Condition(
      +[](FakeObjectStore* store)
           ABSL_NO_THREAD_SAFETY_ANALYSIS { return !store->holding_ || store->cancelled_; },
      this));
  if (cancelled_) return absl::CancelledError("the store was cancelled");
  auto it = objects_.find(absl::StrCat(object.bucket, "/", object.key));
  if (it == objects_.end()) return absl::NotFoundError(absl::StrCat(object.ToString(), ": none"));
  const Object& found = it->second;
  if (!read.etag.empty() && read.etag != found.etag) {
    return absl::FailedPreconditionError(
        absl::StrCat(object.ToString(), " changed: it is ", found.etag, ", not ", read.etag));
  }
  if (offset + length > found.bytes.size()) {
    return absl::OutOfRangeError(absl::StrCat(object.ToString(), ": past its end"));
  }
  if (found.fail_past && offset + length > *found.fail_past) {
    return absl::UnavailableError(absl::StrCat(object.ToString(), ": the store failed mid-object"));
  }
  std::memcpy(destination, found.bytes.data() + offset, length);
  return absl::OkStatus();
}

void FakeObjectStore::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
}

}  // namespace tierd::testing
