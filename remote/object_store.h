// The seam between tierd and an object store that holds models: what the remote reader, the remote
// scan and the catalog ask of one — an object's size and version, the objects right under a
// prefix, byte ranges of an object — and nothing of how it is asked. S3Client (remote/s3_client.h)
// is the store tierd ships; tests use a fake one (tests/fake_object_store.h). Objects are named as
// S3 names them, a bucket and a key (S3Url); a store of another naming maps onto it.
//
// A store is untrusted input: an implementation checks what it is answered (a listing's keys,
// every answer's version and range) as its contract below says, so that its callers need not.
//
// Implementations are thread-safe; every call blocks its caller until it is answered, bounded in
// time as the implementation says.
#ifndef TIERD_REMOTE_OBJECT_STORE_H_
#define TIERD_REMOTE_OBJECT_STORE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "remote/s3_location.h"

namespace tierd {

struct ObjectHead {
  uint64_t size = 0;
  std::string etag;           // the version, without quotes
  std::string last_modified;  // as the store sent it
};

struct ListedObject {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // without its quotes; empty where the store lists none
};

// Bounds on one listing: a store that keeps answering "truncated", or answers with pages or keys
// past these, is refused (DATA_LOSS) rather than followed.
struct ListLimits {
  int page_size = 1000;           // keys asked for per request
  int max_pages = 64;             // requests
  size_t max_objects = 10000;     // objects listed, in all
  uint64_t max_bytes = 32 << 20;  // of every page's answer, together
};

// How one ReadRange is checked and bounded.
struct ObjectReadOptions {
  // The object's version: every answer must carry this ETag (FAILED_PRECONDITION otherwise: it
  // changed). Empty: the first answer's ETag holds for every resumed piece.
  std::string etag;
  // The object's size, when known: a read of all of it is asked for whole, so that the store's
  // checksum of the object comes with the answer and is checked.
  uint64_t object_size = 0;
  // Besides the store's own bound on a call: DEADLINE_EXCEEDED past it.
  absl::Time deadline = absl::InfiniteFuture();
  // The caller's own stop (its client went away): CANCELLED once it is set. Null: none.
  const std::atomic<bool>* cancelled = nullptr;
};

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;

  // The object's size and version. NOT_FOUND for no such object or bucket; the store's errors.
  virtual absl::StatusOr<ObjectHead> Head(const S3Url& object) = 0;

  // The objects right under `prefix` in `bucket` — their keys start with it and hold no "/" after
  // it — in key order. DATA_LOSS for a listing past `limits`, a key outside the prefix, or an
  // answer that is not a listing; CANCELLED once `cancelled` is set; the store's errors.
  virtual absl::StatusOr<std::vector<ListedObject>> List(
      const std::string& bucket, const std::string& prefix, const ListLimits& limits = {},
      const std::atomic<bool>* cancelled = nullptr) = 0;

  // Reads bytes [offset, offset + length) of `object` into `destination`, checked as `read`
  // says. Errors: NOT_FOUND, PERMISSION_DENIED, OUT_OF_RANGE (past the object's end),
  // FAILED_PRECONDITION (the object is no longer of read.etag: it changed), DATA_LOSS (an answer
  // of other bytes than asked), UNAVAILABLE (the store did not answer), DEADLINE_EXCEEDED,
  // CANCELLED (Cancel, or read.cancelled). On error the destination's bytes are unspecified.
  // REQUIRES: destination holds `length` bytes.
  virtual absl::Status ReadRange(const S3Url& object, uint64_t offset, uint64_t length,
                                 uint8_t* destination, const ObjectReadOptions& read = {}) = 0;

  // Makes every call in flight and every later one end CANCELLED, at once (a daemon stopping).
  virtual void Cancel() = 0;

  // Which store this is, as its objects' bytes depend on it (the endpoint's URL): one bucket and
  // key at two stores are two objects (the remote cache keys chunks by it).
  virtual const std::string& id() const = 0;
  // The longest one call may take: a caller waiting on another's call waits no longer.
  virtual absl::Duration call_timeout() const = 0;
};

}  // namespace tierd

#endif  // TIERD_REMOTE_OBJECT_STORE_H_
