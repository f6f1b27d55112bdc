#include "server/raw_call.h"

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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
