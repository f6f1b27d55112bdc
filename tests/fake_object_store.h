// An object store in memory for unit tests of what reads one (the remote reader, the scan): objects
// put by the test, each with an ETag, read as ObjectStore's contract says — a read of another
// version fails FAILED_PRECONDITION, one past the end OUT_OF_RANGE — and what a test makes of it:
// reads held until it lets them go (to see what is asked while they wait, and in which order), a
// failure at an offset of an object, an object changed between reads. Every read is recorded.
//
// Thread-safe.
#ifndef TIERD_TESTS_FAKE_OBJECT_STORE_H_
#define TIERD_TESTS_FAKE_OBJECT_STORE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "remote/object_store.h"

namespace tierd::testing {

class FakeObjectStore final : public ObjectStore {
 public:
  struct Read {
    std::string key;
    uint64_t offset = 0;
    uint64_t length = 0;
  };

  FakeObjectStore() = default;

  // Puts `bytes` as s3://BUCKET/KEY, at a new version; returns its ETag.
  std::string Put(const std::string& bucket, const std::string& key, std::string bytes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Reads wait (having been recorded) until Release; `Hold` again holds later ones.
  void Hold() ABSL_LOCKS_EXCLUDED(mu_);
  void Release() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until `count` reads have been asked for (held or not); false after 10 s.
  bool AwaitReads(size_t count) ABSL_LOCKS_EXCLUDED(mu_);
  // Reads of `key` that reach past `offset` fail UNAVAILABLE from now on.
  void FailPast(const std::string& key, uint64_t offset) ABSL_LOCKS_EXCLUDED(mu_);
  // The reads asked for so far, in the order they were asked.
  std::vector<Read> reads() const ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<ObjectHead> Head(const S3Url& object) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::vector<ListedObject>> List(
      const std::string& bucket, const std::string& prefix, const ListLimits& limits = {},
      const std::atomic<bool>* cancelled = nullptr) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ReadRange(const S3Url& object, uint64_t offset, uint64_t length,
                         uint8_t* destination, const ObjectReadOptions& read = {}) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void Cancel() override ABSL_LOCKS_EXCLUDED(mu_);
  const std::string& id() const override { return id_; }
  absl::Duration call_timeout() const override { return absl::Seconds(10); }

 private:
  struct Object {
    std::string bytes;
    std::string etag;
    std::optional<uint64_t> fail_past;
  };

  const std::string id_ = "fake://store";
  mutable absl::Mutex mu_;
  std::map<std::string, Object> objects_ ABSL_GUARDED_BY(mu_);  // "BUCKET/KEY"
  uint64_t versions_ ABSL_GUARDED_BY(mu_) = 0;
  bool holding_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Read> reads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tierd::testing

#endif  // TIERD_TESTS_FAKE_OBJECT_STORE_H_
