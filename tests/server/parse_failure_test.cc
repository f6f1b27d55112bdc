// DescribeParseFailure and UndecodableRequest: what a request that does not parse is told.
#include "server/parse_failure.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"
#include "tierd/v1/tierd.pb.h"

namespace tierd {
namespace {

using ::tierd::testing::StatusIs;

// Field `field` (below 16) holding `bytes` (under 128 of them): a string, bytes, a nested message
// or packed numbers.
std::string LengthDelimited(int field, const std::string& bytes) {
  return absl::StrCat(std::string(1, static_cast<char>(field << 3 | 2)),
                      std::string(1, static_cast<char>(bytes.size())), bytes);
}

const std::string kNotUtf8("m/\xc3\x28", 4);  // a two-byte sequence whose second byte is wrong
const std::string kNotProtobuf("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11);

// What DescribeParseFailure says of `bytes` as a `Message`, having checked that they do not parse.
template <typename Message>
std::string Describe(const std::string& bytes) {
  Message message;
  EXPECT_FALSE(message.ParseFromString(bytes)) << "the bytes parse";
  return DescribeParseFailure(*Message::descriptor(), bytes);
}

TEST(ParseFailureTest, BytesThatAreNoMessageAreNotProtobufWireFormat) {
  EXPECT_EQ(Describe<v1::SessionRequest>(kNotProtobuf), "not protobuf wire format");
  // A length that runs past the end.
  EXPECT_EQ(Describe<v1::PrefetchRequest>(std::string("\x0a\x10m/", 4)),
            "not protobuf wire format");
  // An end-group tag with no group begun.
  EXPECT_EQ(Describe<v1::GetStatsRequest>(std::string("\x0c", 1)), "not protobuf wire format");
}

TEST(ParseFailureTest, AStringThatIsNotUtf8IsNamedByItsPath) {
  EXPECT_EQ(Describe<v1::PrefetchRequest>(LengthDelimited(1, kNotUtf8)),
            "field keys is not valid UTF-8");
  // After a valid element of the same repeated field.
  EXPECT_EQ(Describe<v1::PrefetchRequest>(LengthDelimited(1, "m/a") + LengthDelimited(1, kNotUtf8)),
            "field keys is not valid UTF-8");
  // Nested: SessionRequest.fetch (4) .key (1); SessionRequest.reserve (6) .tensors (3) .dtype (2).
  EXPECT_EQ(Describe<v1::SessionRequest>(LengthDelimited(4, LengthDelimited(1, kNotUtf8))),
            "field fetch.key is not valid UTF-8");
  EXPECT_EQ(Describe<v1::SessionRequest>(LengthDelimited(
                6, LengthDelimited(1, "kv/a") + LengthDelimited(3, LengthDelimited(2, kNotUtf8)))),
            "field reserve.tensors.dtype is not valid UTF-8");
}

TEST(ParseFailureTest, ANestedMessageOrPackedNumbersThatDoNotParseAreNamed) {
  EXPECT_EQ(Describe<v1::SessionRequest>(LengthDelimited(4, std::string("\xff\xff", 2))),
            "field fetch is not protobuf wire format");
  // TensorInfo.shape (3) is packed uint64: a varint that never ends.
  EXPECT_EQ(Describe<v1::SessionRequest>(LengthDelimited(
                6, LengthDelimited(3, LengthDelimited(3, std::string("\x01\x80", 2))))),
            "field reserve.tensors.shape is not valid packed data");
}

TEST(ParseFailureTest, UnknownFieldsAndBytesFieldsAreNeverBlamed) {
  // Field 15 is unknown to PrefetchRequest, and Handle.handle (3) is bytes: both parse.
  const std::string unknown = LengthDelimited(15, kNotUtf8);
  v1::PrefetchRequest prefetch;
  EXPECT_TRUE(prefetch.ParseFromString(unknown));
  EXPECT_EQ(DescribeParseFailure(*v1::PrefetchRequest::descriptor(), unknown),
            "its fields do not parse");
  v1::Handle handle;
  EXPECT_TRUE(handle.ParseFromString(LengthDelimited(3, kNotUtf8)));
  // An unknown field before the faulty one does not hide it.
  EXPECT_EQ(Describe<v1::PrefetchRequest>(unknown + LengthDelimited(1, kNotUtf8)),
            "field keys is not valid UTF-8");
}

TEST(ParseFailureTest, UndecodableRequestIsInvalidArgumentNamingTheMessage) {
  const absl::Status status =
      UndecodableRequest(*v1::PrefetchRequest::descriptor(), LengthDelimited(1, kNotUtf8));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(status.message(),
            "the request is not a valid tierd.v1.PrefetchRequest: field keys is not valid UTF-8");
}

}  // namespace
}  // namespace tierd
