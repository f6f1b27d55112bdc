#include "remote/s3_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/quote.h"
#include "remote/detail/s3_checksum.h"
#include "remote/detail/s3_exchange.h"
#include "remote/detail/s3_xml.h"

namespace tierd {
namespace {

// A stalled transfer: under this many bytes a second for stall_timeout.
constexpr long kStallBytesPerSecond = 1024;
// An attempt of a read progresses when it brings this many bytes (or the rest of the range): a
// store answering a byte at a time does not reset the count of attempts without progress.
constexpr uint64_t kMinProgressBytes = 64 << 10;
// Attempts of one call in all, as a multiple of max_attempts, however each progresses.
constexpr int kMaxAttemptsFactor = 32;
// A refusal (401, 403) looks for the credentials again at most this often.
constexpr absl::Duration kMinRefreshInterval = absl::Seconds(1);
// The longest continuation token a listing may carry.
constexpr size_t kMaxContinuationToken = 4096;

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

}  // namespace

absl::StatusOr<std::unique_ptr<S3Client>> S3Client::Create(S3ClientOptions options) {
  absl::StatusOr<std::string> endpoint = S3EndpointUrl(options.endpoint);
  if (!endpoint.ok()) return endpoint.status();
  if (absl::Status s = InitCurlOnce(); !s.ok()) return s;
  options.max_attempts = std::max(1, options.max_attempts);
  return std::unique_ptr<S3Client>(new S3Client(std::move(options), *std::move(endpoint)));
}

S3Client::S3Client(S3ClientOptions options, std::string endpoint_url)
    : options_(std::move(options)), endpoint_url_(std::move(endpoint_url)) {
  absl::MutexLock lock(&mu_);
  credentials_ = options_.credentials;
  for (const std::string* secret : {&credentials_.access_key_id, &credentials_.secret_access_key,
                                    &credentials_.session_token}) {
    if (!secret->empty()) secrets_.push_back(*secret);
  }
}

S3Client::~S3Client() {
  absl::MutexLock lock(&mu_);
  for (void* handle : idle_handles_) curl_easy_cleanup(static_cast<CURL*>(handle));
}

void S3Client::Cancel() { cancelled_ = true; }

S3ClientStats S3Client::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

S3Credentials S3Client::credentials() const {
  absl::MutexLock lock(&mu_);
  return credentials_;
}

bool S3Client::RefreshCredentials() {
  if (!options_.refresh_credentials) return false;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Now() - last_refresh_ < kMinRefreshInterval) return false;
    last_refresh_ = absl::Now();
  }
  absl::StatusOr<S3Credentials> found = options_.refresh_credentials();
  if (!found.ok()) {
    TIERD_LOG_EVERY_N_SEC(WARNING, 10)
        << "S3: looking for the credentials again: " << found.status();
    return false;
  }
  absl::MutexLock lock(&mu_);
  if (found->access_key_id == credentials_.access_key_id &&
      found->secret_access_key == credentials_.secret_access_key &&
      found->session_token == credentials_.session_token) {
    return false;
  }
  for (const std::string* secret :
       {&found->access_key_id, &found->secret_access_key, &found->session_token}) {
    if (!secret->empty() &&
        std::find(secrets_.begin(), secrets_.end(), *secret) == secrets_.end()) {
      secrets_.push_back(*secret);
    }
  }
  TIERD_LOG(INFO) << "S3: signing with new credentials, " << found->Describe();
  credentials_ = *std::move(found);
  return true;
}

std::string S3Client::Sanitize(absl::string_view text, size_t max_bytes) const {
  std::string clean(text.substr(0, 64 << 10));
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& secret : secrets_) {
      absl::StrReplaceAll({{secret, "[credentials]"}}, &clean);
    }
  }
  return Quote(clean, max_bytes);
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

void S3Client::Perform(S3Exchange& x) {
  x.StartAttempt();
  CURL* curl = static_cast<CURL*>(AcquireHandle());
  if (curl == nullptr) {
    x.curl = CURLE_OUT_OF_MEMORY;
    return;
  }
  x.handle = curl;
  x.cancelled = &cancelled_;
  x.credentials = credentials();
  const std::string sigv4 = absl::StrCat("aws:amz:", options_.endpoint.region, ":s3");
  curl_slist* headers = curl_slist_append(nullptr, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  if (!x.credentials.session_token.empty()) {
    headers = curl_slist_append(
        headers, absl::StrCat("x-amz-security-token: ", x.credentials.session_token).c_str());
  }
  if (x.ranged) {
    // The store's checksum comes with a whole object's answer only (never with a range's).
    headers = curl_slist_append(headers, "x-amz-checksum-mode: ENABLED");
    if (!x.whole_object || x.received > 0) {
      x.asked_range = true;
      headers = curl_slist_append(headers, absl::StrCat("Range: bytes=", x.offset + x.received, "-",
                                                        x.offset + x.length - 1)
                                               .c_str());
    }
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
  curl_easy_setopt(curl, CURLOPT_USERNAME, x.credentials.access_key_id.c_str());
  curl_easy_setopt(curl, CURLOPT_PASSWORD, x.credentials.secret_access_key.c_str());
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(options_.connect_timeout)));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, kStallBytesPerSecond);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME,
                   std::max<long>(1, absl::ToInt64Seconds(options_.stall_timeout)));
  // The call's deadline bounds each attempt too (the progress callback checks it as well).
  const int64_t left_ms = absl::ToInt64Milliseconds(x.deadline - absl::Now());
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS,
                   static_cast<long>(std::clamp<int64_t>(left_ms, 1, INT32_MAX)));
  curl_easy_setopt(curl, CURLOPT_BUFFERSIZE, 512L << 10);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, x.error_text);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, &S3Exchange::OnHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &x);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &S3Exchange::OnBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &x);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, &S3Exchange::OnProgress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &x);
  if (x.head) curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  if (!options_.system_ca_path.empty()) {
    curl_easy_setopt(curl, CURLOPT_CAPATH, options_.system_ca_path.c_str());
  }
  if (!options_.ca_file.empty()) {
    // The given CA only: the system's directory of CAs would let any publicly trusted
    // certificate for the endpoint's name through.
    curl_easy_setopt(curl, CURLOPT_CAINFO, options_.ca_file.c_str());
    curl_easy_setopt(curl, CURLOPT_CAPATH, nullptr);
  }
  x.curl = curl_easy_perform(curl);
  if (x.http == 0) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &x.http);
  curl_slist_free_all(headers);
  x.handle = nullptr;
  ReleaseHandle(curl);
}

bool S3Client::Backoff(int attempt, absl::Time deadline) {
  thread_local std::minstd_rand random(std::random_device{}());
  const absl::Duration ceiling = std::min(
      options_.max_backoff, options_.initial_backoff * (int64_t{1} << std::min(attempt, 20)));
  const absl::Duration wait = ceiling * std::uniform_real_distribution<double>(0, 1)(random);
  const absl::Time until = std::min(absl::Now() + wait, deadline);
  while (absl::Now() < until) {
    if (cancelled_) return false;
    absl::SleepFor(std::min(until - absl::Now(), absl::Milliseconds(50)));
  }
  return !cancelled_;
}

absl::Status S3Client::RunWithRetries(S3Exchange& x, const std::string& what) {
  const auto stopped = [&] {
    return absl::CancelledError(absl::StrCat(what, ": the client was stopped"));
  };
  const auto past_deadline = [&] {
    return absl::DeadlineExceededError(absl::StrCat(
        what, ": not done within its deadline (",
        x.ranged ? absl::StrCat(x.received, " of ", x.length, " bytes came") : "no answer", ")"));
  };
  x.deadline = std::min(x.deadline, absl::Now() + options_.call_timeout);
  std::string last_error;
  int attempts_without_progress = 0;
  bool refreshed = false;
  for (int attempt = 1;; ++attempt) {
    if (cancelled_) return stopped();
    if (x.caller_cancelled != nullptr && *x.caller_cancelled) {
      return absl::CancelledError(absl::StrCat(what, ": its caller went away"));
    }
    if (absl::Now() >= x.deadline) return past_deadline();
    const uint64_t received_before = x.received;
    Perform(x);
    {
      absl::MutexLock lock(&mu_);
      ++stats_.requests;
      stats_.bytes_received += x.received - received_before;
    }
    if (x.ranged && x.Success() && x.if_match.empty() && !x.etag.empty() && !x.wrong_version) {
      x.if_match = x.etag;  // resumed pieces must come from the same version
    }
    const bool complete = !x.ranged || x.received == x.length;
    if (x.timed_out || (x.curl == CURLE_OPERATION_TIMEDOUT && absl::Now() >= x.deadline)) {
      return past_deadline();
    }
    if (x.curl == CURLE_ABORTED_BY_CALLBACK) {
      return cancelled_ ? stopped()
                        : absl::CancelledError(absl::StrCat(what, ": its caller went away"));
    }
    if (x.wrong_version) {
      if (x.etag.empty()) {
        return absl::DataLossError(absl::StrCat(
            what,
            ": the answer carries no ETag, so its bytes cannot be told to be of the version "
            "read"));
      }
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": the object changed since it was first read (the answer is of ETag ",
                       Sanitize(x.etag, 80), ", not ", Sanitize(x.if_match, 80),
                       "; an endpoint or proxy that ignores If-Match answers so too)"));
    }
    if (x.whole_for_range) {
      return absl::UnavailableError(absl::StrCat(
          what,
          ": the endpoint answered a ranged GET with the whole object (HTTP 200); a proxy "
          "that drops the Range header? Not retried"));
    }
    if (x.wrong_range || x.too_long) {
      return absl::DataLossError(absl::StrCat(
          what, ": the endpoint answered with other bytes than the range asked (Content-Range ",
          Sanitize(x.content_range, 80), ")"));
    }
    if (x.body_cut) {
      return absl::DataLossError(absl::StrCat(what, ": the answer is longer than ",
                                              kMaxS3BodyBytes >> 20, " MiB; refused, not cut"));
    }
    const std::string code = S3ErrorCode(x.body);
    const std::string message = S3ErrorMessage(x.body);
    const std::string named =
        code.empty()
            ? ""
            : absl::StrCat(" (", Sanitize(code, 64),
                           message.empty() ? "" : absl::StrCat(": ", Sanitize(message)), ")");
    if (x.Answered() && x.Success() && complete) {
      if (x.checksum) {
        if (absl::Status s = VerifyS3Checksum(*x.checksum, x.destination, x.length); !s.ok()) {
          return absl::DataLossError(absl::StrCat(
              what, ": the bytes do not match the checksum the store keeps of the object (",
              s.message(), ")"));
        }
      }
      return absl::OkStatus();
    }
    if (x.Answered()) {
      switch (x.http) {
        case 404:
          return absl::NotFoundError(absl::StrCat(what, ": no such object or bucket", named));
        case 401:
        case 403:
          // Expired tokens, a rotated key, clock skew and policies still propagating pass: the
          // next call tries again; this one once more now when the credentials changed.
          if (!refreshed && RefreshCredentials()) {
            refreshed = true;
            continue;
          }
          return absl::PermissionDeniedError(absl::StrCat(
              what, ": refused", named, " for the credentials ", x.credentials.Describe()));
        case 304:
        case 412:
          return absl::FailedPreconditionError(absl::StrCat(
              what, ": the object changed since it was first read (its ETag is no longer ",
              Sanitize(x.if_match, 80), ")"));
        case 416:
          return absl::OutOfRangeError(absl::StrCat(what, ": past the object's end"));
        default:
          break;
      }
    }
    bool retriable;
    if (!x.Answered()) {
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
      return !x.Answered()
                 ? absl::UnavailableError(absl::StrCat(what, ": ", last_error, " (not retried)"))
                 : absl::UnknownError(absl::StrCat(what, ": ", last_error));
    }
    const uint64_t brought = x.received - received_before;
    const bool progressed = brought >= std::min(kMinProgressBytes, x.length - received_before);
    attempts_without_progress =
        x.ranged && brought > 0 && progressed ? 1 : attempts_without_progress + 1;
    if (attempts_without_progress >= options_.max_attempts ||
        attempt >= kMaxAttemptsFactor * options_.max_attempts) {
      return absl::UnavailableError(absl::StrCat(what, ": ", last_error, " (after ", attempt,
                                                 " attempts, ", attempts_without_progress,
                                                 " of them without progress)"));
    }
    {
      absl::MutexLock lock(&mu_);
      ++stats_.retries;
    }
    if (!Backoff(attempts_without_progress - 1, x.deadline)) return stopped();
  }
}

absl::StatusOr<ObjectHead> S3Client::Head(const S3Url& object) {
  S3Exchange x;
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
  return ObjectHead{*x.content_length, x.etag, x.last_modified};
}

absl::StatusOr<std::string> S3Client::Get(const std::string& url, const std::string& what,
                                          const std::atomic<bool>* cancelled) {
  S3Exchange x;
  x.url = url;
  x.caller_cancelled = cancelled;
  absl::Status status = RunWithRetries(x, what);
  if (!status.ok()) {
    absl::MutexLock lock(&mu_);
    ++stats_.failures;
    return status;
  }
  return std::move(x.body);
}

absl::StatusOr<std::vector<ListedObject>> S3Client::List(const std::string& bucket,
                                                         const std::string& prefix,
                                                         const ListLimits& limits,
                                                         const std::atomic<bool>* cancelled) {
  absl::StatusOr<std::string> base = S3ObjectHttpUrl(options_.endpoint, bucket, "");
  if (!base.ok()) return base.status();
  std::vector<ListedObject> objects;
  std::set<std::string> tokens_seen;
  std::string token;
  uint64_t bytes = 0;
  const std::string what = absl::StrCat("listing ", S3Url{bucket, prefix}.ToString());
  const auto refuse = [&](absl::string_view why) {
    absl::MutexLock lock(&mu_);
    ++stats_.failures;
    return absl::DataLossError(absl::StrCat(what, ": ", why));
  };
  for (int page_number = 1;; ++page_number) {
    if (page_number > limits.max_pages) {
      return refuse(absl::StrCat("the store answered with more than ", limits.max_pages,
                                 " pages; refused rather than followed"));
    }
    // The query's parameters in the order SigV4 signs them, their values encoded as it encodes.
    std::string url = absl::StrCat(*base, "?");
    if (!token.empty())
      absl::StrAppend(&url, "continuation-token=", S3UriEncode(token, false), "&");
    absl::StrAppend(&url, "delimiter=%2F&list-type=2&max-keys=", std::max(1, limits.page_size),
                    "&prefix=", S3UriEncode(prefix, false));
    absl::StatusOr<std::string> body = Get(url, what, cancelled);
    if (!body.ok()) return body.status();
    bytes += body->size();
    if (bytes > limits.max_bytes) {
      return refuse(absl::StrCat("the listing's pages are more than ", limits.max_bytes,
                                 " bytes; refused rather than followed"));
    }
    absl::StatusOr<S3ListPage> page = ParseS3ListPage(*body);
    if (!page.ok()) return refuse(page.status().message());
    for (ListedObject& object : page->objects) {
      if (!absl::StartsWith(object.key, prefix)) {
        return refuse(absl::StrCat("the store listed the key ", Sanitize(object.key),
                                   ", which is not under the prefix"));
      }
      if (objects.size() == limits.max_objects) {
        return refuse(absl::StrCat("more than ", limits.max_objects, " objects are listed there"));
      }
      // A store that ignores the delimiter lists what is further down too: not this directory's.
      if (object.key.find('/', prefix.size()) != std::string::npos) continue;
      objects.push_back(std::move(object));
    }
    if (!page->truncated) break;
    if (page->next_continuation_token.size() > kMaxContinuationToken ||
        !tokens_seen.insert(page->next_continuation_token).second) {
      return refuse("the store repeated a continuation token (or sent one too long to be one)");
    }
    token = std::move(page->next_continuation_token);
  }
  return objects;
}

absl::Status S3Client::ReadRange(const S3Url& object, uint64_t offset, uint64_t length,
                                 uint8_t* destination, const ObjectReadOptions& read) {
  if (length == 0) return absl::OkStatus();
  S3Exchange x;
  absl::StatusOr<std::string> url = S3ObjectHttpUrl(options_.endpoint, object.bucket, object.key);
  if (!url.ok()) return url.status();
  x.url = *std::move(url);
  x.ranged = true;
  x.whole_object = offset == 0 && length == read.object_size;
  x.destination = destination;
  x.offset = offset;
  x.length = length;
  x.if_match = read.etag;
  x.deadline = read.deadline;
  x.caller_cancelled = read.cancelled;
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
