#include "remote/s3_location.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace tierd {
namespace {

absl::Status BadUrl(absl::string_view url, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("'", url, "' is not an S3 location: ", why));
}

bool IsBucketCharacter(char c) {
  return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '.' || c == '-';
}

absl::Status CheckBucket(absl::string_view url, absl::string_view bucket) {
  if (bucket.size() < 3 || bucket.size() > 63) {
    return BadUrl(url, "a bucket's name has 3 to 63 characters");
  }
  for (char c : bucket) {
    if (!IsBucketCharacter(c)) {
      return BadUrl(url, "a bucket's name has only lowercase letters, digits, dots and hyphens");
    }
  }
  const auto alnum = [](char c) { return absl::ascii_islower(c) || absl::ascii_isdigit(c); };
  if (!alnum(bucket.front()) || !alnum(bucket.back()) || absl::StrContains(bucket, "..")) {
    return BadUrl(url, "a bucket's name starts and ends with a letter or digit");
  }
  return absl::OkStatus();
}

absl::Status CheckKey(absl::string_view url, absl::string_view key) {
  if (key.size() > 1024) return BadUrl(url, "a key has at most 1024 bytes");
  for (unsigned char c : key) {
    if (c < 0x20 || c == 0x7f) return BadUrl(url, "a key has no control characters");
  }
  for (absl::string_view segment : absl::StrSplit(key, '/')) {
    if (segment == "." || segment == "..") return BadUrl(url, "a key has no . or .. segment");
  }
  return absl::OkStatus();
}

}  // namespace

bool IsS3Path(absl::string_view path) { return absl::StartsWith(path, kS3Scheme); }

std::string S3Url::ToString() const { return absl::StrCat(kS3Scheme, bucket, "/", key); }

absl::StatusOr<S3Url> ParseS3Url(absl::string_view url) {
  if (!IsS3Path(url)) return BadUrl(url, "it does not start with s3://");
  absl::string_view rest = url.substr(kS3Scheme.size());
  const size_t slash = rest.find('/');
  S3Url parsed;
  parsed.bucket = std::string(rest.substr(0, slash));
  if (slash != absl::string_view::npos) parsed.key = std::string(rest.substr(slash + 1));
  if (absl::Status s = CheckBucket(url, parsed.bucket); !s.ok()) return s;
  if (absl::Status s = CheckKey(url, parsed.key); !s.ok()) return s;
  return parsed;
}

absl::StatusOr<std::string> S3EndpointUrl(const S3Endpoint& endpoint) {
  if (endpoint.url.empty()) {
    if (endpoint.region.empty()) {
      return absl::InvalidArgumentError("an S3 endpoint needs a URL or a region");
    }
    return absl::StrCat("https://s3.", endpoint.region, ".amazonaws.com");
  }
  const absl::string_view url = endpoint.url;
  absl::string_view authority;
  if (absl::StartsWith(url, "https://")) {
    authority = url.substr(8);
  } else if (absl::StartsWith(url, "http://")) {
    authority = url.substr(7);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("S3 endpoint '", url, "' is not an http:// or https:// URL"));
  }
  if (authority.empty() || authority.find_first_of("/?#@ ") != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "S3 endpoint '", url, "' must be a scheme, a host and an optional port, nothing else"));
  }
  return std::string(url);
}

std::string S3UriEncode(absl::string_view value, bool keep_slash) {
  std::string encoded;
  encoded.reserve(value.size());
  for (unsigned char c : value) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (c == '/' && keep_slash)) {
      encoded.push_back(static_cast<char>(c));
    } else {
      absl::StrAppendFormat(&encoded, "%%%02X", c);
    }
  }
  return encoded;
}

absl::StatusOr<std::string> S3ObjectHttpUrl(const S3Endpoint& endpoint, const std::string& bucket,
                                            const std::string& key) {
  absl::StatusOr<std::string> base = S3EndpointUrl(endpoint);
  if (!base.ok()) return base.status();
  const std::string path = S3UriEncode(key, /*keep_slash=*/true);
  if (endpoint.path_style) return absl::StrCat(*base, "/", bucket, "/", path);
  const size_t authority = base->find("://") + 3;
  return absl::StrCat(base->substr(0, authority), bucket, ".", base->substr(authority), "/", path);
}

}  // namespace tierd
