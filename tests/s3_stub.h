// A small S3 endpoint on 127.0.0.1 for tests of a store that misbehaves: it serves objects from
// memory (HEAD, ranged GET with If-Match, ListObjectsV2 with prefix, delimiter and continuation)
// as a well-behaved store would, and a test's hook may answer any request otherwise — an endless
// listing, keys outside the prefix, another version's bytes, a whole object for a range, a
// trickle, silence, an error body echoing the request's credentials. The real Ceph gateway
// (tests/s3_gateway.h) stays the reference for a store that behaves; this one is for the rest.
//
// Requests are not authenticated: the stub records what they carried for a test to inspect. One
// thread per connection, at most kMaxConnections at once (later ones are closed at once); every
// thread is joined when the stub goes.
#ifndef TIERD_TESTS_S3_STUB_H_
#define TIERD_TESTS_S3_STUB_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "remote/s3_client.h"

namespace tierd::testing {

struct StubRequest {
  std::string method;                          // "GET", "HEAD", ...
  std::string bucket;                          // decoded
  std::string key;                             // decoded; empty for a bucket's listing
  std::map<std::string, std::string> query;    // decoded
  std::map<std::string, std::string> headers;  // names in lower case

  // The header's value, or "".
  std::string Header(const std::string& lower_case_name) const;
  bool IsListing() const { return method == "GET" && key.empty() && query.count("list-type"); }
};

struct StubAnswer {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;  // Content-Length is added
  std::string body;
  // Misbehaviours. The body's bytes go at most this fast (0: at once).
  uint64_t bytes_per_second = 0;
  // The connection is closed after this many of the body's bytes (the headers promised all).
  std::optional<uint64_t> close_after_bytes;
  // Nothing is sent for this long first (the connection stays open).
  absl::Duration silence = absl::ZeroDuration();

  static StubAnswer Error(int status, const std::string& code, const std::string& message = "");
};

class S3Stub {
 public:
  static constexpr int kMaxConnections = 64;
  // Answers a request itself, or nullopt to let the stub answer it as a well-behaved store.
  using Hook = std::function<std::optional<StubAnswer>(const StubRequest&)>;

  static absl::StatusOr<std::unique_ptr<S3Stub>> Start();
  ~S3Stub();
  S3Stub(const S3Stub&) = delete;
  S3Stub& operator=(const S3Stub&) = delete;

  // http://127.0.0.1:PORT, path-style.
  const S3Endpoint& endpoint() const { return endpoint_; }
  // Keys the client signs with (never checked; a hook may echo them).
  const S3Credentials& credentials() const { return credentials_; }
  // Client options for this stub, with short timeouts and backoffs a test can wait out.
  S3ClientOptions ClientOptions() const;

  // Puts an object; its ETag is `etag`, or by default a hash of its bytes. Returns the ETag.
  std::string PutObject(const std::string& bucket, const std::string& key, std::string bytes,
                        std::string etag = "") ABSL_LOCKS_EXCLUDED(mu_);
  void SetHook(Hook hook) ABSL_LOCKS_EXCLUDED(mu_);

  // Requests answered or refused so far, and those with `method` whose key is `key`.
  int requests() const ABSL_LOCKS_EXCLUDED(mu_);
  int requests_for(const std::string& method, const std::string& key) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The most connections that were open at once.
  int max_open_connections() const { return max_open_.load(); }

  // What the stub would answer as a well-behaved store.
  StubAnswer Answer(const StubRequest& request) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Object {
    std::string bytes;
    std::string etag;
  };
  S3Stub() = default;
  void Accept();
  void Serve(int fd);
  bool Send(int fd, const StubAnswer& answer, bool head);
  StubAnswer ListObjects(const StubRequest& request) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  StubAnswer GetObject(const StubRequest& request) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  S3Endpoint endpoint_;
  S3Credentials credentials_;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<int> open_{0};
  std::atomic<int> max_open_{0};
  std::thread acceptor_;
  mutable absl::Mutex mu_;
  std::map<std::string, Object> objects_ ABSL_GUARDED_BY(mu_);  // "BUCKET/KEY"
  Hook hook_ ABSL_GUARDED_BY(mu_);
  int requests_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::pair<std::string, std::string>, int> requests_by_key_ ABSL_GUARDED_BY(mu_);
  std::vector<int> connections_ ABSL_GUARDED_BY(mu_);  // open sockets, shut down when stopping
  std::vector<std::thread> servers_ ABSL_GUARDED_BY(mu_);
};

// A safetensors file of U8 tensors named `names`, each `bytes_each` bytes of a pattern from `seed`.
std::string StubSafetensors(const std::vector<std::string>& names, uint64_t bytes_each,
                            uint64_t seed = 1);

}  // namespace tierd::testing

#endif  // TIERD_TESTS_S3_STUB_H_
