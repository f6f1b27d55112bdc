// Why bytes that were to be a request do not parse, for the error that answers them and for logs.
// gRPC's generated handlers answer a request that does not parse UNIMPLEMENTED with no message,
// and protobuf says only "false"; a client sending bytes from the wrong proto, or a string that
// is not UTF-8 (which proto3 requires of every string field), should learn which.
#ifndef TIERD_SERVER_PARSE_FAILURE_H_
#define TIERD_SERVER_PARSE_FAILURE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"

namespace tierd {

// Why `bytes` do not parse as a message of `type`, in a few words:
//   "not protobuf wire format"               the bytes are no message at all;
//   "field fetch.key is not valid UTF-8"     a proto3 string field (nested ones named by path);
//   "field open is not protobuf wire format" a nested message's bytes are no message;
//   "field shape is not valid packed data"   a packed repeated number field;
// and, for what none of these explains, "its fields do not parse". Unknown fields are never
// blamed: parsing keeps them. Meant for bytes that failed to parse; names only field names of
// `type`, never the bytes. Thread-safe.
std::string DescribeParseFailure(const google::protobuf::Descriptor& type, absl::string_view bytes);

// INVALID_ARGUMENT "the request is not a valid tierd.v1.PrefetchRequest: field keys is not valid
// UTF-8": the answer to a request of `type` whose `bytes` did not parse.
absl::Status UndecodableRequest(const google::protobuf::Descriptor& type, absl::string_view bytes);

}  // namespace tierd

#endif  // TIERD_SERVER_PARSE_FAILURE_H_
