#include "server/parse_failure.h"

#include <cstdint>
#include <optional>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/stubs/common.h"
#include "google/protobuf/unknown_field_set.h"

namespace tierd {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::FileDescriptor;
using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

// Protobuf's own limit on nested messages; the walk stops there too.
constexpr int kMaxDepth = 100;

// Whether `bytes` are a whole number of packed values of `field`'s type.
bool IsValidPackedData(const FieldDescriptor& field, const std::string& bytes) {
  switch (field.type()) {
    case FieldDescriptor::TYPE_FIXED32:
    case FieldDescriptor::TYPE_SFIXED32:
    case FieldDescriptor::TYPE_FLOAT:
      return bytes.size() % 4 == 0;
    case FieldDescriptor::TYPE_FIXED64:
    case FieldDescriptor::TYPE_SFIXED64:
    case FieldDescriptor::TYPE_DOUBLE:
      return bytes.size() % 8 == 0;
    default: {
      google::protobuf::io::CodedInputStream input(reinterpret_cast<const uint8_t*>(bytes.data()),
                                                   static_cast<int>(bytes.size()));
      uint64_t value;
      while (input.BytesUntilLimit() > 0) {
        if (!input.ReadVarint64(&value)) return false;
      }
      return true;
    }
  }
}

// What is wrong in `bytes` as a `type` message whose path is `path` ("" at the top), or nullopt
// when nothing this walk checks is.
std::optional<std::string> FindFault(const Descriptor& type, const std::string& bytes,
                                     const std::string& path, int depth) {
  const auto field_path = [&path](const FieldDescriptor& field) {
    return path.empty() ? field.name() : absl::StrCat(path, ".", field.name());
  };
  UnknownFieldSet fields;
  if (!fields.ParseFromString(bytes)) {
    return path.empty() ? std::string("not protobuf wire format")
                        : absl::StrCat("field ", path, " is not protobuf wire format");
  }
  for (int i = 0; i < fields.field_count(); ++i) {
    const UnknownField& value = fields.field(i);
    const FieldDescriptor* field = type.FindFieldByNumber(value.number());
    // A number the type does not know, or a wire type its field does not have, is kept as an
    // unknown field: no fault.
    if (field == nullptr || value.type() != UnknownField::TYPE_LENGTH_DELIMITED) continue;
    const std::string& content = value.length_delimited();
    if (field->type() == FieldDescriptor::TYPE_STRING &&
        field->file()->syntax() == FileDescriptor::SYNTAX_PROTO3 &&
        !google::protobuf::internal::IsStructurallyValidUTF8(content.data(),
                                                             static_cast<int>(content.size()))) {
      return absl::StrCat("field ", field_path(*field), " is not valid UTF-8");
    }
    if (field->type() == FieldDescriptor::TYPE_MESSAGE) {
      if (depth + 1 >= kMaxDepth) {
        return absl::StrCat("field ", field_path(*field), " nests messages more than ", kMaxDepth,
                            " deep");
      }
      std::optional<std::string> nested =
          FindFault(*field->message_type(), content, field_path(*field), depth + 1);
      if (nested.has_value()) return nested;
    }
    if (field->is_packable() && !IsValidPackedData(*field, content)) {
      return absl::StrCat("field ", field_path(*field), " is not valid packed data");
    }
  }
  return std::nullopt;
}

}  // namespace

std::string DescribeParseFailure(const Descriptor& type, absl::string_view bytes) {
  return FindFault(type, std::string(bytes), "", 0).value_or("its fields do not parse");
}

absl::Status UndecodableRequest(const Descriptor& type, absl::string_view bytes) {
  return absl::InvalidArgumentError(absl::StrCat("the request is not a valid ", type.full_name(),
                                                 ": ", DescribeParseFailure(type, bytes)));
}

}  // namespace tierd
