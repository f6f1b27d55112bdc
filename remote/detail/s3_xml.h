// The few S3 XML answers tierd reads: ListObjectsV2's result and an error's code. Not a general XML
// parser: S3 answers are flat, and only named elements' text is taken, entities decoded.
//
// Private to remote/.
#ifndef TIERD_REMOTE_DETAIL_S3_XML_H_
#define TIERD_REMOTE_DETAIL_S3_XML_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "remote/s3_client.h"

namespace tierd {

struct S3ListPage {
  std::vector<ListedObject> objects;
  bool truncated = false;
  std::string next_continuation_token;
};

// A ListObjectsV2 result. DATA_LOSS for a body that is not one (a proxy's page, a cut answer).
absl::StatusOr<S3ListPage> ParseS3ListPage(absl::string_view xml);

// The <Code> of an S3 error body ("NoSuchKey", "SlowDown"); empty when there is none.
std::string S3ErrorCode(absl::string_view xml);

// The <Message> of an S3 error body, as the store wrote it (untrusted text); empty when none.
std::string S3ErrorMessage(absl::string_view xml);

// `etag` without the double quotes S3 wraps it in.
std::string UnquoteETag(absl::string_view etag);

}  // namespace tierd

#endif  // TIERD_REMOTE_DETAIL_S3_XML_H_
