// Where an S3 object lives: an s3:// URL (a bucket and a key or key prefix), and the endpoint that
// serves the bucket (AWS, Ceph's gateway, MinIO, a cloud's S3-compatible endpoint).
#ifndef TIERD_REMOTE_S3_LOCATION_H_
#define TIERD_REMOTE_S3_LOCATION_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tierd {

// "s3://" — what marks a model path as remote.
inline constexpr absl::string_view kS3Scheme = "s3://";

// True when `path` names an S3 location (starts with s3://); it may still fail to parse.
bool IsS3Path(absl::string_view path);

struct S3Url {
  std::string bucket;
  std::string key;  // an object's key, or a prefix (empty: the whole bucket)

  // "s3://BUCKET/KEY".
  std::string ToString() const;
};

// Parses "s3://BUCKET[/KEY]". INVALID_ARGUMENT, saying what is wrong, for anything else: a bucket
// name S3 would not accept (3-63 characters of lowercase letters, digits, dots and hyphens,
// starting and ending with a letter or digit), a key of over 1024 bytes, or with control
// characters or a "." or ".." segment (a key is later a file name in the remote cache).
absl::StatusOr<S3Url> ParseS3Url(absl::string_view url);

// How requests reach the buckets.
struct S3Endpoint {
  // "https://s3.us-east-1.amazonaws.com", "http://127.0.0.1:7480": a scheme (http or https), a
  // host and an optional port, nothing after. Empty: AWS's endpoint for `region`.
  std::string url;
  std::string region = "us-east-1";
  // Path-style addressing (ENDPOINT/BUCKET/KEY) rather than virtual-hosted (BUCKET.HOST/KEY). Most
  // self-hosted gateways need it; AWS prefers virtual-hosted.
  bool path_style = true;
};

// The endpoint's url, checked (INVALID_ARGUMENT, saying why), or AWS's for its region.
absl::StatusOr<std::string> S3EndpointUrl(const S3Endpoint& endpoint);

// The HTTP URL of `key` in `bucket` at `endpoint` (validated by S3EndpointUrl), the key
// percent-encoded as SigV4 signs it: every byte but unreserved characters and "/" encoded.
absl::StatusOr<std::string> S3ObjectHttpUrl(const S3Endpoint& endpoint, const std::string& bucket,
                                            const std::string& key);

// `value` percent-encoded as SigV4 wants: unreserved characters (A-Z a-z 0-9 - _ . ~) kept, every
// other byte as %XX, "/" too unless `keep_slash`.
std::string S3UriEncode(absl::string_view value, bool keep_slash);

}  // namespace tierd

#endif  // TIERD_REMOTE_S3_LOCATION_H_
