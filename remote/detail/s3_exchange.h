// One attempt of an S3 request and what came back, with the request's state kept across
// attempts (a ranged GET's progress, the version it is pinned to, the store's checksum of the
// object), and libcurl's callbacks, which match an answer's first bytes to the read — its ETag,
// then its range — before any of them is taken into the caller's memory.
//
// Private to remote/ (the S3 client's).
#ifndef TIERD_REMOTE_DETAIL_S3_EXCHANGE_H_
#define TIERD_REMOTE_DETAIL_S3_EXCHANGE_H_

#include <curl/curl.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "remote/detail/s3_checksum.h"
#include "remote/s3_credentials.h"

namespace tierd {

// How much of an answer's body is kept when it is not object bytes (a listing page, an error).
// A longer one is refused, never taken cut.
inline constexpr size_t kMaxS3BodyBytes = 8 << 20;

struct S3Exchange {
  // ---- The request ----
  std::string url;
  bool head = false;
  // A ranged GET's bytes go to destination[received, length): offset + received onward.
  bool ranged = false;
  // The range is the whole object: the first attempt asks without a Range, for the checksum.
  bool whole_object = false;
  uint8_t* destination = nullptr;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t received = 0;               // kept across attempts
  std::string if_match;                // set from the first answer's ETag when the caller gave none
  std::optional<S3Checksum> checksum;  // the store's, of the whole object, from any attempt
  absl::Time deadline = absl::InfiniteFuture();
  const std::atomic<bool>* caller_cancelled = nullptr;
  S3Credentials credentials;  // of this attempt

  // ---- One attempt's answer ----
  CURL* handle = nullptr;
  const std::atomic<bool>* cancelled = nullptr;
  CURLcode curl = CURLE_OK;
  long http = 0;
  bool asked_range = false;      // this attempt sent a Range header
  bool checked_start = false;    // the body's first bytes were matched to the range asked
  bool wrong_range = false;      // the answer did not start where asked
  bool too_long = false;         // an answer longer than the range
  bool whole_for_range = false;  // 200, the whole object, to a ranged GET
  bool wrong_version = false;    // an answer of another ETag than the read's
  bool body_cut = false;         // a body past kMaxS3BodyBytes
  bool timed_out = false;        // the call's deadline passed
  std::string etag;
  std::string last_modified;
  std::string content_range;
  std::optional<uint64_t> content_length;
  std::optional<S3Checksum> answer_checksum;
  std::string body;  // of answers that are not object bytes
  char error_text[CURL_ERROR_SIZE] = {};

  // Forgets the last attempt's answer.
  void StartAttempt();
  bool Success() const { return http >= 200 && http < 300; }
  // Whether the transfer itself ended without a transport failure (a write callback that
  // stopped it on purpose included).
  bool Answered() const { return curl == CURLE_OK || curl == CURLE_WRITE_ERROR; }
  // Matches an answer's first bytes to the read: its version, then its range. False (and a
  // flag saying why) when none of its bytes may be taken.
  bool CheckStart();

  // libcurl's callbacks; `user` is the exchange.
  static size_t OnHeader(char* data, size_t size, size_t count, void* user);
  static size_t OnBody(char* data, size_t size, size_t count, void* user);
  static int OnProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t);
};

}  // namespace tierd

#endif  // TIERD_REMOTE_DETAIL_S3_EXCHANGE_H_
