// The object checksums an S3 store may send with an answer that is a whole object (GetObject
// with x-amz-checksum-mode: ENABLED): x-amz-checksum-crc32, -crc32c, -crc64nvme, -sha1 and
// -sha256, each the base64 of the digest's big-endian bytes. A composite checksum (a multipart
// upload's checksum of its parts' checksums, "VALUE-N") says nothing of the bytes of one answer
// and is not checked.
//
// Private to remote/.
#ifndef TIERD_REMOTE_DETAIL_S3_CHECKSUM_H_
#define TIERD_REMOTE_DETAIL_S3_CHECKSUM_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tierd {

// One checksum an answer carried: the header's algorithm and its value as sent.
struct S3Checksum {
  std::string algorithm;  // "crc32", "crc32c", "crc64nvme", "sha1", "sha256"
  std::string value;      // base64
};

// The checksum header `name: value` names, or nullopt for any other header and for a composite
// checksum. `name` in lower case.
std::optional<S3Checksum> ParseS3ChecksumHeader(absl::string_view name, absl::string_view value);

// OK when `bytes` have `checksum`; DATA_LOSS saying both values when they do not;
// INVALID_ARGUMENT for an algorithm this does not know or a value that is not base64.
absl::Status VerifyS3Checksum(const S3Checksum& checksum, const uint8_t* bytes, uint64_t size);

// The checksum `algorithm` gives `bytes`, base64 as S3 writes it; empty for an unknown algorithm.
std::string ComputeS3Checksum(absl::string_view algorithm, const uint8_t* bytes, uint64_t size);

}  // namespace tierd

#endif  // TIERD_REMOTE_DETAIL_S3_CHECKSUM_H_
