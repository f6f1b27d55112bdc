// Requests to an S3 endpoint over HTTP(S), signed with SigV4: an object's size and ETag, the
// objects right under a prefix, and byte ranges of an object read straight into the caller's
// memory. libcurl does the HTTP, the TLS (the system's CA store, or only the CA file given) and
// the signing (CURLOPT_AWS_SIGV4); its easy handles are pooled, so connections are reused across
// requests.
//
// Each call runs on the caller's thread and blocks until it is answered, for at most call_timeout
// (retries and backoffs included) or the caller's own deadline. Faults a real network has are
// retried with exponential backoff and full jitter — connections refused, reset or stalled (no
// progress for stall_timeout), 5xx answers, throttling (429, SlowDown) — and a range that broke
// off is resumed from its last byte, against the same ETag. A refusal (401, 403) is retried once
// with credentials found again (refresh_credentials: a rotated file), when they changed.
//
// The store is not trusted: every answer to a read must carry the ETag the read is for (an
// endpoint or proxy that ignores If-Match is caught), a ranged GET must be answered with that
// range (206), and a whole object's answer is checked against the checksum the store sends with
// it (x-amz-checksum-*). A listing is bounded in pages, objects and bytes, must stay under its
// prefix and must not repeat a continuation token. Text from the store (error codes and
// messages) reaches messages quoted, bounded, and with the client's credentials cut out.
// Bounding how many calls run at once is the caller's job (RemoteReader).
//
// No secret appears in any message this returns, nor in what it logs. Thread-safe.
#ifndef TIERD_REMOTE_S3_CLIENT_H_
#define TIERD_REMOTE_S3_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "remote/object_store.h"
#include "remote/s3_credentials.h"
#include "remote/s3_location.h"

namespace tierd {

struct S3Exchange;  // one attempt of a request and what came back (remote/detail/s3_exchange.h)

struct S3ClientOptions {
  S3Endpoint endpoint;
  S3Credentials credentials;
  // Finds the credentials again, as they were first found (a credentials file an operator or an
  // agent rotated). Called when the store refuses a request (401, 403), at most once a second;
  // null: `credentials` hold for good.
  std::function<absl::StatusOr<S3Credentials>()> refresh_credentials;
  absl::Duration connect_timeout = absl::Seconds(10);
  // A request that moves fewer than 1 KiB a second for this long is abandoned (and retried).
  absl::Duration stall_timeout = absl::Seconds(20);
  // Attempts of a request that makes no progress before it fails UNAVAILABLE (at least 1). An
  // attempt progresses when it brings at least 64 KiB (or the rest); at most 32 times as many
  // attempts are made in all, however each progresses.
  int max_attempts = 6;
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  // The most one call may take, its attempts and backoffs included: DEADLINE_EXCEEDED past it,
  // however slowly bytes still come.
  absl::Duration call_timeout = absl::Minutes(2);
  // A CA bundle to trust instead of the system's: the only certificates trusted then. Empty: the
  // system's store.
  std::string ca_file;
  // The system's store: a directory of hashed CA certificates; empty: libcurl's own default. A
  // test's stand-in for /etc/ssl/certs; unused when ca_file is set.
  std::string system_ca_path;
};

struct S3ClientStats {
  uint64_t requests = 0;  // attempts sent, retries included
  uint64_t retries = 0;
  uint64_t bytes_received = 0;  // object bytes written to callers' memory
  uint64_t failures = 0;        // calls that returned an error
};

class S3Client final : public ObjectStore {
 public:
  // INVALID_ARGUMENT for an endpoint S3EndpointUrl refuses; INTERNAL when libcurl will not start.
  static absl::StatusOr<std::unique_ptr<S3Client>> Create(S3ClientOptions options);
  ~S3Client() override;
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  // The object's size and ETag (HEAD). NOT_FOUND for no such object or bucket.
  absl::StatusOr<ObjectHead> Head(const S3Url& object) override ABSL_LOCKS_EXCLUDED(mu_);

  // The objects right under `prefix` in `bucket` — their keys start with it and hold no "/"
  // after it (ListObjectsV2 with delimiter "/") — in key order, every page of the listing.
  // DATA_LOSS for a listing past `limits`, a key outside the prefix, a repeated continuation
  // token, or a page that is not a listing or was cut; the client's errors otherwise.
  absl::StatusOr<std::vector<ListedObject>> List(
      const std::string& bucket, const std::string& prefix, const ListLimits& limits = {},
      const std::atomic<bool>* cancelled = nullptr) override ABSL_LOCKS_EXCLUDED(mu_);

  // Reads bytes [offset, offset + length) of `object` into `destination`, checked as `read`
  // says. Errors: NOT_FOUND, PERMISSION_DENIED (credentials or policy), OUT_OF_RANGE (past the
  // object's end), FAILED_PRECONDITION (the object is no longer of read.etag: it changed),
  // DATA_LOSS (an answer of other bytes than the range asked, without an ETag, or failing the
  // store's own checksum), UNAVAILABLE (the endpoint did not answer after max_attempts without
  // progress, or answered a range with the whole object), DEADLINE_EXCEEDED (call_timeout or
  // read.deadline passed), CANCELLED (Cancel, or read.cancelled). On error the destination's
  // bytes are unspecified. REQUIRES: destination holds `length` bytes.
  absl::Status ReadRange(const S3Url& object, uint64_t offset, uint64_t length,
                         uint8_t* destination, const ObjectReadOptions& read = {}) override
      ABSL_LOCKS_EXCLUDED(mu_);

  // Makes every call in flight and every later one end CANCELLED, at once (a daemon stopping).
  void Cancel() override;

  S3ClientStats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  const S3ClientOptions& options() const { return options_; }
  // The endpoint's URL, as requests go to it ("https://s3.us-east-1.amazonaws.com").
  const std::string& endpoint_url() const { return endpoint_url_; }
  const std::string& id() const override { return endpoint_url_; }
  absl::Duration call_timeout() const override { return options_.call_timeout; }

  // `text` from the store (an error's code or message, a header), fit for a message or a log:
  // every occurrence of the credentials' key id, secret or token replaced by "[credentials]",
  // then quoted onto one line and cut to `max_bytes`.
  std::string Sanitize(absl::string_view text, size_t max_bytes = 160) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit S3Client(S3ClientOptions options, std::string endpoint_url);

  S3Credentials credentials() const ABSL_LOCKS_EXCLUDED(mu_);
  // Finds the credentials again after a refusal; true when they changed (retry with them).
  bool RefreshCredentials() ABSL_LOCKS_EXCLUDED(mu_);

  void* AcquireHandle() ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseHandle(void* handle) ABSL_LOCKS_EXCLUDED(mu_);
  // Sends one attempt of `exchange` and fills in its outcome.
  void Perform(S3Exchange& exchange) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `exchange` until it succeeds, fails for good, or runs out of attempts without progress;
  // `prepare` readies each attempt (and resumes a range).
  absl::Status RunWithRetries(S3Exchange& exchange, const std::string& what)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Sleeps a full-jitter backoff for `attempt` (0-based), at most until `deadline`; false when
  // cancelled meanwhile.
  bool Backoff(int attempt, absl::Time deadline);
  absl::StatusOr<std::string> Get(const std::string& url, const std::string& what,
                                  const std::atomic<bool>* cancelled) ABSL_LOCKS_EXCLUDED(mu_);

  const S3ClientOptions options_;
  const std::string endpoint_url_;
  std::atomic<bool> cancelled_{false};
  mutable absl::Mutex mu_;
  std::vector<void*> idle_handles_ ABSL_GUARDED_BY(mu_);
  S3ClientStats stats_ ABSL_GUARDED_BY(mu_);
  S3Credentials credentials_ ABSL_GUARDED_BY(mu_);
  // Every key id, secret and token this client has signed with: cut out of the store's text.
  std::vector<std::string> secrets_ ABSL_GUARDED_BY(mu_);
  absl::Time last_refresh_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace tierd

#endif  // TIERD_REMOTE_S3_CLIENT_H_
