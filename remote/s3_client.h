// Requests to an S3 endpoint over HTTP(S), signed with SigV4: an object's size and ETag, a
// bucket's listing under a prefix, and byte ranges of an object read straight into the caller's
// memory. libcurl does the HTTP, the TLS (the system's CA store) and the signing
// (CURLOPT_AWS_SIGV4); its easy handles are pooled, so connections are reused across requests.
//
// Each call runs on the caller's thread and blocks until it is answered. Faults a real network
// has are retried with exponential backoff and full jitter — connections refused, reset or
// stalled (no progress for stall_timeout), 5xx answers, throttling (429, SlowDown) — and a range
// that broke off is resumed from its last byte, against the same ETag. Bounding how many calls run
// at once is the caller's job (RemoteReader).
//
// No secret appears in any message this returns, nor in what it logs. Thread-safe.
#ifndef TIERD_REMOTE_S3_CLIENT_H_
#define TIERD_REMOTE_S3_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "remote/s3_credentials.h"
#include "remote/s3_location.h"

namespace tierd {

struct S3ClientOptions {
  S3Endpoint endpoint;
  S3Credentials credentials;
  absl::Duration connect_timeout = absl::Seconds(10);
  // A request that moves fewer than 1 KiB a second for this long is abandoned (and retried).
  absl::Duration stall_timeout = absl::Seconds(20);
  // Attempts of a request that makes no progress before it fails UNAVAILABLE (at least 1).
  int max_attempts = 6;
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  // A CA bundle to trust instead of the system's; empty: the system's store.
  std::string ca_file;
};

struct S3ObjectHead {
  uint64_t size = 0;
  std::string etag;           // without quotes
  std::string last_modified;  // as the endpoint sent it
};

struct S3ListedObject {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // without its quotes
};

struct S3ClientStats {
  uint64_t requests = 0;  // attempts sent, retries included
  uint64_t retries = 0;
  uint64_t bytes_received = 0;  // object bytes written to callers' memory
  uint64_t failures = 0;        // calls that returned an error
};

class S3Client {
 public:
  // INVALID_ARGUMENT for an endpoint S3EndpointUrl refuses; INTERNAL when libcurl will not start.
  static absl::StatusOr<std::unique_ptr<S3Client>> Create(S3ClientOptions options);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  // The object's size and ETag (HEAD). NOT_FOUND for no such object or bucket.
  absl::StatusOr<S3ObjectHead> Head(const S3Url& object) ABSL_LOCKS_EXCLUDED(mu_);

  // The objects of `bucket` whose keys start with `prefix`, in key order, every page of the
  // listing (ListObjectsV2, `page_size` keys a request).
  absl::StatusOr<std::vector<S3ListedObject>> List(const std::string& bucket,
                                                   const std::string& prefix, int page_size = 1000)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Reads bytes [offset, offset + length) of `object` into `destination`. With `if_match` set, the
  // object must still have that ETag: FAILED_PRECONDITION (it changed) otherwise; without, the
  // ETag of the first answer holds for every resumed piece. Errors: NOT_FOUND, PERMISSION_DENIED
  // (credentials or policy), OUT_OF_RANGE (past the object's end), DATA_LOSS (an answer that does
  // not match the range asked), UNAVAILABLE (the endpoint did not answer after max_attempts
  // without progress), CANCELLED (Cancel). REQUIRES: destination holds `length` bytes.
  absl::Status ReadRange(const S3Url& object, uint64_t offset, uint64_t length,
                         uint8_t* destination, const std::string& if_match = "")
      ABSL_LOCKS_EXCLUDED(mu_);

  // Makes every call in flight and every later one end CANCELLED, at once (a daemon stopping).
  void Cancel();

  S3ClientStats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  const S3ClientOptions& options() const { return options_; }

 private:
  struct Exchange;  // one attempt of a request and what came back
  explicit S3Client(S3ClientOptions options, std::string endpoint_url);

  void* AcquireHandle() ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseHandle(void* handle) ABSL_LOCKS_EXCLUDED(mu_);
  // Sends one attempt of `exchange` and fills in its outcome.
  void Perform(Exchange& exchange) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `exchange` until it succeeds, fails for good, or runs out of attempts without progress;
  // `prepare` readies each attempt (and resumes a range).
  absl::Status RunWithRetries(Exchange& exchange, const std::string& what) ABSL_LOCKS_EXCLUDED(mu_);
  // Sleeps a full-jitter backoff for `attempt` (0-based); false when cancelled meanwhile.
  bool Backoff(int attempt);
  absl::StatusOr<std::string> Get(const std::string& url, const std::string& what)
      ABSL_LOCKS_EXCLUDED(mu_);

  const S3ClientOptions options_;
  const std::string endpoint_url_;
  std::atomic<bool> cancelled_{false};
  mutable absl::Mutex mu_;
  std::vector<void*> idle_handles_ ABSL_GUARDED_BY(mu_);
  S3ClientStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tierd

#endif  // TIERD_REMOTE_S3_CLIENT_H_
