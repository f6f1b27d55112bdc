#include "server/raw_call.h"

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <climits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "server/parse_failure.h"

namespace tierd {

absl::Status ParseRequest(const grpc::ByteBuffer& raw, google::protobuf::Message& request) {
  {
    grpc::ByteBuffer reading(raw);  // the reader takes a mutable buffer; this copies references
    grpc::ProtoBufferReader reader(&reading);
    if (reader.status().ok() && request.ParseFromZeroCopyStream(&reader)) {
      return absl::OkStatus();
    }
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (raw.Dump(&slices).ok()) {
    for (const grpc::Slice& slice : slices) {
      bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
  }
  return UndecodableRequest(*request.GetDescriptor(), bytes);
}

absl::StatusOr<std::string> PeekStringField(const grpc::ByteBuffer& raw, int field) {
  grpc::ByteBuffer reading(raw);  // the reader takes a mutable buffer; this copies references
  grpc::ProtoBufferReader reader(&reading);
  if (!reader.status().ok()) {
    return absl::InvalidArgumentError("the request could not be read");
  }
  google::protobuf::io::CodedInputStream input(&reader);
  input.SetTotalBytesLimit(INT_MAX);
  std::string value;
  while (const uint32_t tag = input.ReadTag()) {
    if (google::protobuf::internal::WireFormatLite::GetTagFieldNumber(tag) == field &&
        google::protobuf::internal::WireFormatLite::GetTagWireType(tag) ==
            google::protobuf::internal::WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      if (!google::protobuf::internal::WireFormatLite::ReadString(&input, &value)) {
        return absl::InvalidArgumentError("the request is not a message");
      }
    } else if (!google::protobuf::internal::WireFormatLite::SkipField(&input, tag)) {
      return absl::InvalidArgumentError("the request is not a message");
    }
  }
  if (!input.ConsumedEntireMessage()) {
    return absl::InvalidArgumentError("the request is not a message");
  }
  return value;
}

absl::Status Serialize(const google::protobuf::Message& message, grpc::ByteBuffer& raw) {
  raw.Clear();  // gRPC's writer fills only an empty buffer
  bool own_buffer = false;
  const grpc::Status serialized =
      grpc::SerializationTraits<google::protobuf::Message>::Serialize(message, &raw, &own_buffer);
  if (!serialized.ok()) {
    return absl::InternalError(absl::StrCat("cannot serialize a ", message.GetTypeName(), ": ",
                                            serialized.error_message()));
  }
  return absl::OkStatus();
}

}  // namespace tierd
