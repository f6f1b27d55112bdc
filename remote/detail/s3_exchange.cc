#include "remote/detail/s3_exchange.h"

#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "remote/detail/s3_xml.h"

namespace tierd {
namespace {

// "bytes START-END/TOTAL": START, or nullopt.
std::optional<uint64_t> ContentRangeStart(absl::string_view value) {
  if (!absl::ConsumePrefix(&value, "bytes ")) return std::nullopt;
  uint64_t start;
  if (!absl::SimpleAtoi(value.substr(0, value.find('-')), &start)) return std::nullopt;
  return start;
}

}  // namespace

void S3Exchange::StartAttempt() {
  curl = CURLE_OK;
  http = 0;
  asked_range = checked_start = wrong_range = too_long = false;
  whole_for_range = wrong_version = body_cut = timed_out = false;
  etag.clear();
  last_modified.clear();
  content_range.clear();
  content_length.reset();
  answer_checksum.reset();
  body.clear();
  error_text[0] = '\0';
}

bool S3Exchange::CheckStart() {
  const uint64_t want = offset + received;
  if (etag.empty() || (!if_match.empty() && etag != if_match)) {
    wrong_version = true;
    return false;
  }
  if (http == 206) {
    if (ContentRangeStart(content_range) != want) {
      wrong_range = true;
      return false;
    }
    return true;
  }
  // 200: the whole object. Taken only when that is what was asked for.
  if (asked_range || want != 0) {
    whole_for_range = true;
    return false;
  }
  if (content_length && *content_length != length) {
    wrong_range = true;
    return false;
  }
  if (answer_checksum) checksum = answer_checksum;
  return true;
}

size_t S3Exchange::OnHeader(char* data, size_t size, size_t count, void* user) {
  auto& x = *static_cast<S3Exchange*>(user);
  const absl::string_view line(data, size * count);
  if (absl::StartsWith(line, "HTTP/")) {  // a new answer (after a 100 Continue): start over
    x.etag.clear();
    x.content_range.clear();
    x.content_length.reset();
    x.answer_checksum.reset();
    return line.size();
  }
  const size_t colon = line.find(':');
  if (colon == absl::string_view::npos) return line.size();
  const std::string name = absl::AsciiStrToLower(line.substr(0, colon));
  const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
  if (name == "etag") {
    x.etag = UnquoteETag(value);
  } else if (name == "last-modified") {
    x.last_modified = std::string(value);
  } else if (name == "content-range") {
    x.content_range = std::string(value);
  } else if (name == "content-length") {
    uint64_t n;
    if (absl::SimpleAtoi(value, &n)) x.content_length = n;
  } else if (std::optional<S3Checksum> checksum = ParseS3ChecksumHeader(name, value)) {
    x.answer_checksum = std::move(checksum);
  }
  return line.size();
}

size_t S3Exchange::OnBody(char* data, size_t size, size_t count, void* user) {
  auto& x = *static_cast<S3Exchange*>(user);
  size_t bytes = size * count;
  if (x.http == 0) curl_easy_getinfo(x.handle, CURLINFO_RESPONSE_CODE, &x.http);
  if (!x.ranged || !x.Success()) {
    if (x.body.size() + bytes > kMaxS3BodyBytes) {
      x.body_cut = true;
      return 0;
    }
    x.body.append(data, bytes);
    return bytes;
  }
  if (!x.checked_start) {
    x.checked_start = true;
    if (!x.CheckStart()) return 0;
  }
  const uint64_t room = x.length - x.received;
  if (bytes > room) {
    std::memcpy(x.destination + x.received, data, room);
    x.received += room;
    x.too_long = true;
    return 0;
  }
  std::memcpy(x.destination + x.received, data, bytes);
  x.received += bytes;
  return bytes;
}

int S3Exchange::OnProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto& x = *static_cast<S3Exchange*>(user);
  if (x.cancelled->load(std::memory_order_relaxed)) return 1;
  if (x.caller_cancelled != nullptr && x.caller_cancelled->load(std::memory_order_relaxed)) {
    return 1;
  }
  if (absl::Now() >= x.deadline) {
    x.timed_out = true;
    return 1;
  }
  return 0;
}

}  // namespace tierd
