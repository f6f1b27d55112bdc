#include "remote/s3_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "remote/detail/s3_xml.h"

namespace tierd {
namespace {

// How much of an answer's body is kept when it is not object bytes (a listing page, an error).
constexpr size_t kMaxBodyBytes = 8 << 20;
// A stalled transfer: under this many bytes a second for stall_timeout.
constexpr long kStallBytesPerSecond = 1024;

absl::Status InitCurlOnce() {
  static const CURLcode code = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (code != CURLE_OK) {
    return absl::InternalError(absl::StrCat("libcurl will not start: ", curl_easy_strerror(code)));
  }
  return absl::OkStatus();
}

// Transport failures a later attempt may not meet.
bool IsRetriable(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

bool IsRetriable(long http, const std::string& code) {
  return http == 429 || http == 500 || http == 502 || http == 503 || http == 504 ||
         code == "SlowDown" || code == "RequestTimeout" || code == "InternalError";
}

// "bytes START-END/TOTAL": START, or nullopt.
std::optional<uint64_t> ContentRangeStart(absl::string_view value) {
  if (!absl::ConsumePrefix(&value, "bytes ")) return std::nullopt;
  uint64_t start;
  if (!absl::SimpleAtoi(value.substr(0, value.find('-')), &start)) return std::nullopt;
  return start;
}

}  // namespace

struct S3Client::Exchange {
  // ---- The request ----
  std::string url;
  bool head = false;
  // A ranged GET's bytes go to destination[received, length): offset + received onward.
  bool ranged = false;
  uint8_t* destination = nullptr;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t received = 0;  // kept across attempts
  std::string if_match;   // set from the first answer's ETag when the caller gave none

  // ---- One attempt's answer ----
  CURL* handle = nullptr;
  const std::atomic<bool>* cancelled = nullptr;
  CURLcode curl = CURLE_OK;
  long http = 0;
  bool checked_start = false;  // the body's first bytes were matched to the range asked
  bool wrong_range = false;    // the answer did not start where asked
  bool too_long = false;       // an answer longer than the range
  uint64_t skip = 0;           // bytes to drop first (a 200 answer to a ranged request)
  std::string etag;
  std::string last_modified;
  std::string content_range;
  std::optional<uint64_t> content_length;
  std::string body;  // of answers that are not object bytes
  char error_text[CURL_ERROR_SIZE] = {};

  void StartAttempt() {
    curl = CURLE_OK;
    http = 0;
    checked_start = wrong_range = too_long = false;
    skip = 0;
    etag.clear();
    last_modified.clear();
    content_range.clear();
    content_length.reset();
    body.clear();
    error_text[0] = '\0';
  }
  bool Success() const { return http >= 200 && http < 300; }

  static size_t OnHeader(char* data, size_t size, size_t count, void* user) {
    auto& x = *static_cast<Exchange*>(user);
    const absl::string_view line(data, size * count);
    if (absl::StartsWith(line, "HTTP/")) {  // a new answer (after a 100 Continue): start over
      x.etag.clear();
      x.content_range.clear();
      x.content_length.reset();
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
    }
    return line.size();
  }

  static size_t OnBody(char* data, size_t size, size_t count, void* user) {
    auto& x = *static_cast<Exchange*>(user);
    size_t bytes = size * count;
    if (x.http == 0) curl_easy_getinfo(x.handle, CURLINFO_RESPONSE_CODE, &x.http);
    if (!x.ranged || !x.Success()) {
      if (x.body.size() + bytes > kMaxBodyBytes) return 0;
      x.body.append(data, bytes);
      return bytes;
    }
    if (!x.checked_start) {
      x.checked_start = true;
      const uint64_t want = x.offset + x.received;
      if (x.http == 206) {
        if (ContentRangeStart(x.content_range) != want) {
          x.wrong_range = true;
          return 0;
        }
      } else {
        x.skip = want;  // the whole object: drop what comes before the range
      }
    }
    const size_t dropped = static_cast<size_t>(std::min<uint64_t>(x.skip, bytes));
    x.skip -= dropped;
    data += dropped;
    const size_t taken = bytes - dropped;
    const uint64_t room = x.length - x.received;
    if (taken > room) {
      std::memcpy(x.destination + x.received, data, room);
      x.received += room;
      if (x.http == 206) x.too_long = true;
      return 0;  // all that was asked for is here (a 200's tail is not wanted)
    }
    std::memcpy(x.destination + x.received, data, taken);
    x.received += taken;
    return bytes;
  }

  static int OnProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    auto& x = *static_cast<Exchange*>(user);
    return x.cancelled->load(std::memory_order_relaxed) ? 1 : 0;
  }
};

absl::StatusOr<std::unique_ptr<S3Client>> S3Client::Create(S3ClientOptions options) {
  absl::StatusOr<std::string> endpoint = S3EndpointUrl(options.endpoint);
  if (!endpoint.ok()) return endpoint.status();
  if (absl::Status s = InitCurlOnce(); !s.ok()) return s;
  options.max_attempts = std::max(1, options.max_attempts);
  return std::unique_ptr<S3Client>(new S3Client(std::move(options), *std::move(endpoint)));
}

S3Client::S3Client(S3ClientOptions options, std::string endpoint_url)
    : options_(std::move(options)), endpoint_url_(std::move(endpoint_url)) {}

S3Client::~S3Client() {
  absl::MutexLock lock(&mu_);
  for (void* handle : idle_handles_) curl_easy_cleanup(static_cast<CURL*>(handle));
}

void S3Client::Cancel() { cancelled_ = true; }

S3ClientStats S3Client::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void* S3Client::AcquireHandle() {
  {
    absl::MutexLock lock(&mu_);
    if (!idle_handles_.empty()) {
      void* handle = idle_handles_.back();
      idle_handles_.pop_back();
      return handle;
    }
  }
  return curl_easy_init();
}

void S3Client::ReleaseHandle(void* handle) {
  // reset keeps the handle's live connections: the next request reuses them.
  curl_easy_reset(static_cast<CURL*>(handle));
  absl::MutexLock lock(&mu_);
  idle_handles_.push_back(handle);
}

void S3Client::Perform(Exchange& x) {
  x.StartAttempt();
  CURL* curl = static_cast<CURL*>(AcquireHandle());
  if (curl == nullptr) {
    x.curl = CURLE_OUT_OF_MEMORY;
    return;
  }
  x.handle = curl;
  x.cancelled = &cancelled_;
  const std::string sigv4 = absl::StrCat("aws:amz:", options_.endpoint.region, ":s3");
  curl_slist* headers = curl_slist_append(nullptr, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  if (!options_.credentials.session_token.empty()) {
    headers = curl_slist_append(
        headers,
        absl::StrCat("x-amz-security-token: ", options_.credentials.session_token).c_str());
  }
  if (x.ranged) {
    headers = curl_slist_append(
        headers,
        absl::StrCat("Range: bytes=", x.offset + x.received, "-", x.offset + x.length - 1).c_str());
  }
  if (!x.if_match.empty()) {
    headers = curl_slist_append(headers, absl::StrCat("If-Match: \"", x.if_match, "\"").c_str());
  }
  curl_easy_setopt(curl, CURLOPT_URL, x.url.c_str());
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4.c_str());
  curl_easy_setopt(curl, CURLOPT_USERNAME, options_.credentials.access_key_id.c_str());
  curl_easy_setopt(curl, CURLOPT_PASSWORD, options_.credentials.secret_access_key.c_str());
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(options_.connect_timeout)));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, kStallBytesPerSecond);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME,
                   std::max<long>(1, absl::ToInt64Seconds(options_.stall_timeout)));
  curl_easy_setopt(curl, CURLOPT_BUFFERSIZE, 512L << 10);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, x.error_text);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, &Exchange::OnHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &x);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Exchange::OnBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &x);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, &Exchange::OnProgress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &x);
  if (x.head) curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  if (!options_.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, options_.ca_file.c_str());
  x.curl = curl_easy_perform(curl);
  if (x.http == 0) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &x.http);
  curl_slist_free_all(headers);
  x.handle = nullptr;
  ReleaseHandle(curl);
}

bool S3Client::Backoff(int attempt) {
  thread_local std::minstd_rand random(std::random_device{}());
  const absl::Duration ceiling = std::min(
      options_.max_backoff, options_.initial_backoff * (int64_t{1} << std::min(attempt, 20)));
  const absl::Duration wait = ceiling * std::uniform_real_distribution<double>(0, 1)(random);
  const absl::Time until = absl::Now() + wait;
  while (absl::Now() < until) {
    if (cancelled_) return false;
    absl::SleepFor(std::min(until - absl::Now(), absl::Milliseconds(50)));
  }
  return !cancelled_;
}

absl::Status S3Client::RunWithRetries(Exchange& x, const std::string& what) {
  std::string last_error;
  int attempts_without_progress = 0;
  while (true) {
    if (cancelled_) return absl::CancelledError(absl::StrCat(what, ": the client was stopped"));
    const uint64_t received_before = x.received;
    Perform(x);
    {
      absl::MutexLock lock(&mu_);
      ++stats_.requests;
      stats_.bytes_received += x.received - received_before;
    }
    if (x.ranged && x.Success() && x.if_match.empty() && !x.etag.empty()) {
      x.if_match = x.etag;  // resumed pieces must come from the same version
    }
    const bool complete = !x.ranged || x.received == x.length;
    if (x.curl == CURLE_ABORTED_BY_CALLBACK) {
      return absl::CancelledError(absl::StrCat(what, ": the client was stopped"));
    }
    if (x.wrong_range || x.too_long) {
      return absl::DataLossError(absl::StrCat(
          what, ": the endpoint answered with other bytes than the range asked (Content-Range '",
          x.content_range, "')"));
    }
    const std::string code = S3ErrorCode(x.body);
    const std::string named = code.empty() ? "" : absl::StrCat(" (", code, ")");
    if ((x.curl == CURLE_OK || x.curl == CURLE_WRITE_ERROR) && x.Success() && complete) {
      return absl::OkStatus();
    }
    if (x.curl == CURLE_OK || x.curl == CURLE_WRITE_ERROR) {
      switch (x.http) {
        case 404:
          return absl::NotFoundError(absl::StrCat(what, ": no such object or bucket", named));
        case 401:
        case 403:
          return absl::PermissionDeniedError(absl::StrCat(
              what, ": refused", named, " for the credentials ", options_.credentials.Describe()));
        case 304:
        case 412:
          return absl::FailedPreconditionError(absl::StrCat(
              what, ": the object changed since it was first read (its ETag is no longer ",
              x.if_match, ")"));
        case 416:
          return absl::OutOfRangeError(absl::StrCat(what, ": past the object's end"));
        default:
          break;
      }
    }
    bool retriable;
    if (x.curl != CURLE_OK && x.curl != CURLE_WRITE_ERROR) {
      retriable = IsRetriable(x.curl);
      last_error = absl::StrCat(curl_easy_strerror(x.curl),
                                x.error_text[0] != '\0' ? absl::StrCat(": ", x.error_text) : "");
    } else if (x.Success()) {
      retriable = true;  // an answer cut short: resume it
      last_error = absl::StrCat("the answer ended after ", x.received, " of ", x.length, " bytes");
    } else {
      retriable = IsRetriable(x.http, code);
      last_error = absl::StrCat("HTTP ", x.http, named);
    }
    if (!retriable) {
      // A transport failure no retry mends (an untrusted certificate, a bad URL) leaves the
      // endpoint unusable as configured; an answer's own error says what it is.
      return x.curl != CURLE_OK && x.curl != CURLE_WRITE_ERROR
                 ? absl::UnavailableError(absl::StrCat(what, ": ", last_error, " (not retried)"))
                 : absl::UnknownError(absl::StrCat(what, ": ", last_error));
    }
    attempts_without_progress = x.received > received_before ? 1 : attempts_without_progress + 1;
    if (attempts_without_progress >= options_.max_attempts) {
      return absl::UnavailableError(absl::StrCat(what, ": ", last_error, " (after ",
                                                 attempts_without_progress,
                                                 " attempts without progress)"));
    }
    {
      absl::MutexLock lock(&mu_);
      ++stats_.retries;
    }
    if (!Backoff(attempts_without_progress - 1)) {
      return absl::CancelledError(absl::StrCat(what, ": the client was stopped"));
    }
  }
}

absl::StatusOr<S3ObjectHead> S3Client::Head(const S3Url& object) {
  Exchange x;
  absl::StatusOr<std::string> url = S3ObjectHttpUrl(options_.endpoint, object.bucket, object.key);
  if (!url.ok()) return url.status();
  x.url = *std::move(url);
  x.head = true;
  absl::Status status = RunWithRetries(x, absl::StrCat("HEAD ", object.ToString()));
  if (status.ok() && !x.content_length) {
    status = absl::DataLossError(
        absl::StrCat("HEAD ", object.ToString(), ": the answer has no Content-Length"));
  }
  if (!status.ok()) {
    absl::MutexLock lock(&mu_);
    ++stats_.failures;
    return status;
  }
  return S3ObjectHead{*x.content_length, x.etag, x.last_modified};
}

absl::StatusOr<std::string> S3Client::Get(const std::string& url, const std::string& what) {
  Exchange x;
  x.url = url;
  absl::Status status = RunWithRetries(x, what);
  if (!status.ok()) {
    absl::MutexLock lock(&mu_);
    ++stats_.failures;
    return status;
  }
  return std::move(x.body);
}

absl::StatusOr<std::vector<S3ListedObject>> S3Client::List(const std::string& bucket,
                                                           const std::string& prefix,
                                                           int page_size) {
  absl::StatusOr<std::string> base = S3ObjectHttpUrl(options_.endpoint, bucket, "");
  if (!base.ok()) return base.status();
  std::vector<S3ListedObject> objects;
  std::string token;
  const std::string what = absl::StrCat("listing ", S3Url{bucket, prefix}.ToString());
  while (true) {
    // The query's parameters in the order SigV4 signs them, their values encoded as it encodes.
    std::string url = absl::StrCat(*base, "?");
    if (!token.empty())
      absl::StrAppend(&url, "continuation-token=", S3UriEncode(token, false), "&");
    absl::StrAppend(&url, "list-type=2&max-keys=", std::max(1, page_size),
                    "&prefix=", S3UriEncode(prefix, false));
    absl::StatusOr<std::string> body = Get(url, what);
    if (!body.ok()) return body.status();
    absl::StatusOr<S3ListPage> page = ParseS3ListPage(*body);
    if (!page.ok()) {
      return absl::Status(page.status().code(), absl::StrCat(what, ": ", page.status().message()));
    }
    for (S3ListedObject& object : page->objects) objects.push_back(std::move(object));
    if (!page->truncated) break;
    token = std::move(page->next_continuation_token);
  }
  return objects;
}

absl::Status S3Client::ReadRange(const S3Url& object, uint64_t offset, uint64_t length,
                                 uint8_t* destination, const std::string& if_match) {
  if (length == 0) return absl::OkStatus();
  Exchange x;
  absl::StatusOr<std::string> url = S3ObjectHttpUrl(options_.endpoint, object.bucket, object.key);
  if (!url.ok()) return url.status();
  x.url = *std::move(url);
  x.ranged = true;
  x.destination = destination;
  x.offset = offset;
  x.length = length;
  x.if_match = if_match;
  absl::Status status = RunWithRetries(
      x,
      absl::StrCat("reading bytes ", offset, "-", offset + length - 1, " of ", object.ToString()));
  if (!status.ok()) {
    absl::MutexLock lock(&mu_);
    ++stats_.failures;
  }
  return status;
}

}  // namespace tierd
