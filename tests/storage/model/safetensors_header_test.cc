#include "storage/model/safetensors_header.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOk;
using ::tierd::testing::RandomTensor;
using ::tierd::testing::TempDir;
using ::tierd::testing::TensorSpec;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
constexpr absl::StatusCode kDataLoss = absl::StatusCode::kDataLoss;
constexpr const char* kAllDTypes[] = {"BOOL", "U8",  "I8",  "F8_E5M2", "F8_E4M3",
                                      "I16",  "U16", "F16", "BF16",    "I32",
                                      "U32",  "F32", "F64", "I64",     "U64"};

// Matches a StatusOr refused with `code` whose message contains every one of `fragments`.
MATCHER_P2(RefusedWith, code, fragments,
           absl::StrCat("is refused with ", absl::StatusCodeToString(code), " naming \"",
                        absl::StrJoin(fragments, "\", \""), "\"")) {
  *result_listener << arg.status();
  if (arg.status().code() != code) return false;
  return std::all_of(fragments.begin(), fragments.end(), [&](const std::string& fragment) {
    return absl::StrContains(arg.status().message(), fragment);
  });
}
using Fragments = std::vector<std::string>;

// A safetensors file in memory: 8-byte little-endian length (`declared`, or the header's size),
// the header, the data.
std::string FileBytes(const std::string& header, const std::string& data,
                      std::optional<uint64_t> declared = std::nullopt) {
  const uint64_t length = declared.value_or(header.size());
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return bytes + header + data;
}

class SafetensorsHeaderTest : public ::testing::Test {
 protected:
  // Writes a raw file (see WriteRawSafetensors) and reads its header back.
  absl::StatusOr<SafetensorsHeader> ReadRaw(const std::string& header, const std::string& data,
                                            std::optional<uint64_t> declared = std::nullopt) {
    EXPECT_THAT(testing::WriteRawSafetensors(path_, header, data, declared), IsOk());
    return ReadSafetensorsHeader(path_);
  }

  TempDir dir_;
  const std::string path_ = dir_.path() + "/model-00001.safetensors";
};

TEST_F(SafetensorsHeaderTest, ValidFileRoundTripsEveryDTypeWithEmptyTensorsAndMetadata) {
  std::vector<TensorSpec> specs;
  uint64_t seed = 1;
  for (const char* dtype : kAllDTypes) {
    specs.push_back(RandomTensor(absl::StrCat("blocks.0.", dtype), dtype, {2, 3}, seed++));
  }
  specs.push_back(RandomTensor("empty.vector", "F32", {0}, seed++));
  specs.push_back(RandomTensor("empty.matrix", "BF16", {3, 0}, seed++));
  specs.push_back(RandomTensor("scalar", "F64", {}, seed++));
  specs.push_back(RandomTensor("cube", "U8", {4, 5, 6}, seed++));
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {"note", "\xc3\xbcn \"quoted\""}};
  ASSERT_THAT(testing::WriteSafetensors(path_, specs, metadata), IsOk());

  const absl::StatusOr<SafetensorsHeader> header = ReadSafetensorsHeader(path_);
  ASSERT_THAT(header, IsOk());
  const uint64_t data_start = 8 + testing::SafetensorsHeaderJson(specs, metadata).size();
  EXPECT_EQ(header->data_start, data_start);
  EXPECT_EQ(header->metadata, metadata);

  // The writer lays data out in the order given; the parser sorts by (begin, name), which puts
  // "empty.matrix" before "empty.vector" although it was written second.
  std::vector<std::tuple<uint64_t, std::string, const TensorSpec*>> expected;
  uint64_t offset = data_start;
  for (const TensorSpec& spec : specs) {
    expected.emplace_back(offset, spec.name, &spec);
    offset += spec.data.size();
  }
  std::sort(expected.begin(), expected.end());
  const std::string file = testing::ReadWholeFile(path_);
  ASSERT_EQ(header->tensors.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const auto& [begin, name, spec] = expected[i];
    const SafetensorsTensor& tensor = header->tensors[i];
    SCOPED_TRACE(name);
    EXPECT_EQ(tensor.name, name);
    EXPECT_STREQ(DTypeName(tensor.dtype), spec->dtype.c_str());
    EXPECT_EQ(tensor.shape, spec->shape);
    EXPECT_EQ(tensor.begin, begin);
    EXPECT_EQ(tensor.end, begin + spec->data.size());
    EXPECT_EQ(file.substr(tensor.begin, tensor.size()), spec->data);
  }
  EXPECT_EQ(header->tensors[15].name, "empty.matrix");
  EXPECT_EQ(header->tensors[16].name, "empty.vector");
  EXPECT_EQ(header->tensors.back().end, file.size());
}

TEST_F(SafetensorsHeaderTest, ErrorMessageNamesTheFileTheTensorAndTheProblem) {
  const std::string bytes = FileBytes(
      R"({"blocks.3.attn.q.weight":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", "abcd");
  EXPECT_EQ(
      ParseSafetensorsHeader("model-00001.safetensors", bytes, bytes.size()).status(),
      absl::InvalidArgumentError(
          R"(model-00001.safetensors: tensor "blocks.3.attn.q.weight": dtype "F33" is unknown)"));
}

TEST_F(SafetensorsHeaderTest, TensorsAreSortedByOffsetThenNameWhateverTheHeaderOrder) {
  const std::string header = R"({"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},)"
                             R"("z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                             R"("c":{"dtype":"F32","shape":[2,0],"data_offsets":[4,4]},)"
                             R"("a":{"dtype":"I16","shape":[2],"data_offsets":[0,4]}})";
  const absl::StatusOr<SafetensorsHeader> parsed = ReadRaw(header, std::string(8, 'x'));
  ASSERT_THAT(parsed, IsOk());
  std::vector<std::tuple<std::string, uint64_t, uint64_t>> got;
  for (const SafetensorsTensor& t : parsed->tensors) got.emplace_back(t.name, t.begin, t.end);
  const uint64_t start = 8 + header.size();
  EXPECT_EQ(
      got, (std::vector<std::tuple<std::string, uint64_t, uint64_t>>{{"a", start, start + 4},
                                                                     {"b", start + 4, start + 8},
                                                                     {"c", start + 4, start + 4},
                                                                     {"z", start + 4, start + 4}}));
}

TEST_F(SafetensorsHeaderTest, EmptyObjectPaddedWithSpacesHasNoTensors) {
  const absl::StatusOr<SafetensorsHeader> parsed = ReadRaw("{}      ", "");
  ASSERT_THAT(parsed, IsOk());
  EXPECT_EQ(parsed->data_start, 16u);
  EXPECT_TRUE(parsed->tensors.empty());
  EXPECT_TRUE(parsed->metadata.empty());
}

TEST_F(SafetensorsHeaderTest, LimitsAreInclusiveAndBracketsInStringsDoNotNest) {
  const std::string name(4096, 'n');
  std::string shape = "1";
  for (int i = 1; i < 64; ++i) shape += ",1";
  const std::string header =
      absl::StrCat(R"({"__metadata__":{"k":"[[[[[[[[[[{{{{{{{{{{"},")", name,
                   R"(":{"dtype":"F32","shape":[)", shape, R"(],"data_offsets":[0,4]},)",
                   R"("huge.but.empty":{"dtype":"F32","shape":[0,1099511627776],)",
                   R"("data_offsets":[4,4]},"neg.zero":{"dtype":"U8","shape":[-0],)",
                   R"("data_offsets":[4,4]}})");
  const absl::StatusOr<SafetensorsHeader> parsed = ReadRaw(header, "abcd");
  ASSERT_THAT(parsed, IsOk());
  ASSERT_EQ(parsed->tensors.size(), 3u);
  EXPECT_EQ(parsed->tensors[0].name, name);
  EXPECT_EQ(parsed->tensors[0].shape.size(), 64u);
  EXPECT_EQ(parsed->tensors[1].shape, (std::vector<uint64_t>{0, 1ull << 40}));
  EXPECT_EQ(parsed->metadata.at("k"), "[[[[[[[[[[{{{{{{{{{{");
}

TEST_F(SafetensorsHeaderTest, ParserNeedsOnlyTheHeaderBytesOfALargerFile) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[1000],"data_offsets":[0,4000]}})";
  const std::string bytes = FileBytes(header, "");
  const absl::StatusOr<SafetensorsHeader> parsed =
      ParseSafetensorsHeader("w.safetensors", bytes, bytes.size() + 4000);
  ASSERT_THAT(parsed, IsOk());
  ASSERT_EQ(parsed->tensors.size(), 1u);
  EXPECT_EQ(parsed->tensors[0].end, bytes.size() + 4000);
}

TEST_F(SafetensorsHeaderTest, CallerPassingFewerBytesThanTheHeaderIsInvalidArgument) {
  const std::string bytes = FileBytes("{}", "0123456789");
  EXPECT_THAT(ParseSafetensorsHeader("w.safetensors", bytes.substr(0, 9), bytes.size()),
              RefusedWith(kInvalid, Fragments{"w.safetensors"}));
  EXPECT_THAT(ParseSafetensorsHeader("w.safetensors", bytes.substr(0, 4), bytes.size()),
              RefusedWith(kInvalid, Fragments{"w.safetensors"}));
}

TEST_F(SafetensorsHeaderTest, FileShorterThanTheLengthPrefixIsTruncated) {
  for (const std::string& contents : {std::string(), std::string("\x02\0\0", 3)}) {
    ASSERT_THAT(testing::WriteFile(path_, contents), IsOk());
    EXPECT_THAT(ReadSafetensorsHeader(path_), RefusedWith(kDataLoss, Fragments{path_}));
  }
}

TEST_F(SafetensorsHeaderTest, FileShorterThanItsHeaderIsTruncated) {
  EXPECT_THAT(ReadRaw("{}", "", 100), RefusedWith(kDataLoss, Fragments{path_, "truncated"}));
  EXPECT_THAT(ReadRaw("{}", "", kMaxSafetensorsHeaderBytes),
              RefusedWith(kDataLoss, Fragments{path_, "truncated"}));
}

TEST_F(SafetensorsHeaderTest, HeaderLengthOverTheLimitIsRefusedWithoutReadingIt) {
  for (const uint64_t length :
       {kMaxSafetensorsHeaderBytes + 1, uint64_t{1} << 63, std::numeric_limits<uint64_t>::max()}) {
    EXPECT_THAT(ReadRaw("{}", "", length), RefusedWith(kInvalid, Fragments{path_, "limit"}))
        << length;
  }
}

TEST_F(SafetensorsHeaderTest, DataShorterThanTheOffsetsIsTruncated) {
  const std::vector<TensorSpec> specs = {RandomTensor("first", "F32", {4}, 1),
                                         RandomTensor("last", "F16", {8}, 2)};
  ASSERT_THAT(testing::WriteSafetensors(path_, specs), IsOk());
  const std::string file = testing::ReadWholeFile(path_);
  ASSERT_THAT(testing::WriteFile(path_, file.substr(0, file.size() - 1)), IsOk());
  EXPECT_THAT(ReadSafetensorsHeader(path_),
              RefusedWith(kDataLoss, Fragments{path_, "tensor \"last\"", "truncated"}));
}

TEST_F(SafetensorsHeaderTest, MissingFileIsNotFoundAndDirectoryIsRefused) {
  EXPECT_THAT(ReadSafetensorsHeader(dir_.path() + "/absent.safetensors"),
              testing::StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(ReadSafetensorsHeader(dir_.path()), RefusedWith(kInvalid, Fragments{dir_.path()}));
}

// A header refused with `code`; besides the file name, its message must contain `fragment`, where
// "%" stands for anything (absolute offsets, which depend on the header's length).
struct MalformedCase {
  std::string name;  // the behaviour, as a test name
  std::string header;
  size_t data_bytes;
  absl::StatusCode code;
  std::string fragment;
};

std::string Entry(absl::string_view dtype, absl::string_view shape, absl::string_view offsets) {
  return absl::StrCat(R"({"dtype":)", dtype, R"(,"shape":)", shape, R"(,"data_offsets":)", offsets,
                      "}");
}
// {"t": {...}}: one tensor named "t".
std::string OneTensor(absl::string_view dtype, absl::string_view shape, absl::string_view offsets) {
  return absl::StrCat(R"({"t":)", Entry(dtype, shape, offsets), "}");
}

std::vector<MalformedCase> MalformedCases() {
  const std::string t = "tensor \"t\": ";
  const std::string f32x2 = Entry(R"("F32")", "[2]", "[0,8]");
  std::string rank65 = "[1";
  for (int i = 1; i < 65; ++i) rank65 += ",1";
  rank65 += "]";
  return {
      {"UnknownDType", OneTensor(R"("F33")", "[2]", "[0,8]"), 8, kInvalid,
       t + "dtype \"F33\" is unknown"},
      {"LowercaseDType", OneTensor(R"("f32")", "[2]", "[0,8]"), 8, kInvalid, t + "dtype \"f32\""},
      {"DTypeNotAString", OneTensor("4", "[2]", "[0,8]"), 8, kInvalid, t + "\"dtype\" must be"},
      {"NegativeDimension", OneTensor(R"("F32")", "[-2]", "[0,8]"), 8, kInvalid,
       t + "\"shape\" must hold non-negative integers, not a negative"},
      {"FloatDimension", OneTensor(R"("F32")", "[2.0]", "[0,8]"), 8, kInvalid, t + "\"shape\""},
      {"ExponentDimension", OneTensor(R"("F32")", "[2e0]", "[0,8]"), 8, kInvalid, t + "\"shape\""},
      {"StringDimension", OneTensor(R"("F32")", R"(["2"])", "[0,8]"), 8, kInvalid,
       t + "\"shape\" must hold non-negative integers, not a string"},
      {"NullDimension", OneTensor(R"("F32")", "[null]", "[0,8]"), 8, kInvalid, t + "\"shape\""},
      {"BoolDimension", OneTensor(R"("F32")", "[true]", "[0,8]"), 8, kInvalid, t + "\"shape\""},
      {"NestedDimension", OneTensor(R"("F32")", "[[2]]", "[0,8]"), 8, kInvalid, t + "\"shape\""},
      {"ShapeNotAnArray", OneTensor(R"("F32")", "2", "[0,8]"), 8, kInvalid,
       t + "\"shape\" must be an array"},
      {"RankOver64", OneTensor(R"("F32")", rank65, "[0,4]"), 4, kInvalid,
       t + "\"shape\" has more than 64 dimensions"},
      {"OneOffset", OneTensor(R"("F32")", "[2]", "[8]"), 8, kInvalid,
       t + "\"data_offsets\" must be [begin, end]"},
      {"ThreeOffsets", OneTensor(R"("F32")", "[2]", "[0,8,8]"), 8, kInvalid,
       t + "\"data_offsets\" must be [begin, end]"},
      {"OffsetsNotAnArray", OneTensor(R"("F32")", "[2]", "{}"), 8, kInvalid,
       t + "\"data_offsets\" must be an array"},
      {"NegativeOffset", OneTensor(R"("F32")", "[2]", "[-8,0]"), 8, kInvalid,
       t + "\"data_offsets\" must hold non-negative integers"},
      {"FloatOffset", OneTensor(R"("F32")", "[2]", "[0,8.0]"), 8, kInvalid,
       t + "\"data_offsets\" must hold non-negative integers, not a number with a fraction"},
      {"OffsetBeyond2To64", OneTensor(R"("U8")", "[2]", "[0,18446744073709551616]"), 8, kInvalid,
       t + "\"data_offsets\" must hold non-negative integers, not %or beyond 2^64 - 1"},
      {"BeginAfterEnd", OneTensor(R"("F32")", "[2]", "[8,0]"), 8, kInvalid,
       t + "data_offsets [8, 0] end before they begin"},
      {"OffsetsOverflowWithDataStart",
       OneTensor(R"("U8")", "[3]", "[18446744073709551612,18446744073709551615]"), 8, kInvalid,
       t + "data_offsets [18446744073709551612, 18446744073709551615] overflow"},
      {"ShapeProductOverflow", OneTensor(R"("U8")", "[4294967296,4294967296]", "[0,0]"), 0,
       kInvalid, t + "shape [4294967296, 4294967296] of U8 overflows"},
      {"ShapeTimesDTypeSizeOverflow", OneTensor(R"("F32")", "[4611686018427387904]", "[0,0]"), 0,
       kInvalid, t + "shape [4611686018427387904] of F32 overflows 64 bits"},
      {"ShapeTimesDTypeSizeNotTheLength", OneTensor(R"("F32")", "[2,3]", "[0,20]"), 24, kInvalid,
       t + "shape [2, 3] of F32 needs 24 bytes but data_offsets [0, 20] hold 20"},
      {"OffsetsPastTheEndOfTheFile", OneTensor(R"("F32")", "[2]", "[4,12]"), 8, kDataLoss,
       t + "data_offsets [4, 12] run past the end of the file"},
      {"OverlappingTensors",
       absl::StrCat(R"({"a":)", f32x2, R"(,"b":)", Entry(R"("F32")", "[2]", "[4,12]"), "}"), 12,
       kInvalid, "tensors \"a\" [%, %) and \"b\" [%, %) overlap"},
      {"IdenticalRanges", absl::StrCat(R"({"a":)", f32x2, R"(,"b":)", f32x2, "}"), 8, kInvalid,
       "overlap"},
      {"MissingDType", R"({"t":{"shape":[2],"data_offsets":[0,8]}})", 8, kInvalid,
       t + "\"dtype\" is missing"},
      {"MissingShape", R"({"t":{"dtype":"F32","data_offsets":[0,8]}})", 8, kInvalid,
       t + "\"shape\" is missing"},
      {"MissingDataOffsets", R"({"t":{"dtype":"F32","shape":[2]}})", 8, kInvalid,
       t + "\"data_offsets\" is missing"},
      {"ExtraKey", R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"offsets":[0,8]}})", 8,
       kInvalid, t + "unknown key \"offsets\""},
      {"DuplicateTensorName", absl::StrCat(R"({"t":)", f32x2, R"(,"t":)", f32x2, "}"), 8, kInvalid,
       "tensor \"t\" appears twice"},
      {"DuplicateDTypeInEntry",
       R"({"t":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8, kInvalid,
       t + "\"dtype\" appears twice"},
      {"DuplicateOffsetsInEntry",
       R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"data_offsets":[0,8]}})", 8,
       kInvalid, t + "\"data_offsets\" appears twice"},
      {"DuplicateMetadataObject", R"({"__metadata__":{},"__metadata__":{}})", 0, kInvalid,
       "\"__metadata__\" appears twice"},
      {"DuplicateMetadataKey", R"({"__metadata__":{"k":"a","k":"b"}})", 0, kInvalid,
       "metadata key \"k\" appears twice"},
      {"NumberInMetadata", R"({"__metadata__":{"k":1}})", 0, kInvalid,
       "metadata \"k\" must be a string, not a number"},
      {"ObjectInMetadata", R"({"__metadata__":{"k":{"x":"y"}}})", 0, kInvalid,
       "metadata \"k\" must be a string, not an object"},
      {"MetadataNotAnObject", R"({"__metadata__":"pt"})", 0, kInvalid,
       "\"__metadata__\" must be an object"},
      {"EmptyTensorName", absl::StrCat(R"({"":)", f32x2, "}"), 8, kInvalid, "empty name"},
      {"OverlongTensorName", absl::StrCat(R"({")", std::string(4097, 'n'), R"(":)", f32x2, "}"), 8,
       kInvalid, "longer than 4096 bytes"},
      {"EntryNotAnObject", R"({"t":[0,8]})", 8, kInvalid, t + "entry must be an object"},
      {"HeaderIsAnArray", "[]", 0, kInvalid, "must be a JSON object, not an array"},
      {"HeaderIsANumber", "5", 0, kInvalid, "must be a JSON object, not a number"},
      {"HeaderIsAString", R"("{}")", 0, kInvalid, "must be a JSON object, not a string"},
      {"GarbageJson", "{not json}", 0, kInvalid, "not valid JSON"},
      {"TrailingGarbage", "{} x", 0, kInvalid, "not valid JSON"},
      {"EmptyHeader", "", 0, kInvalid, "not valid JSON"},
      {"UnterminatedObject", R"({"t":)", 0, kInvalid, "not valid JSON"},
      {"InvalidUtf8", "{\"\xff\xfe\":1}", 0, kInvalid, "not valid JSON"},
      {"DeepUnbalancedNesting", std::string(100000, '['), 0, kInvalid, "nests deeper than"},
      {"DeepBalancedNesting", std::string(100000, '[') + std::string(100000, ']'), 0, kInvalid,
       "nests deeper than"},
      {"DeepNestingInsideAnEntry", R"({"t":{"shape":)" + std::string(100000, '{'), 0, kInvalid,
       "nests deeper than"},
  };
}

void PrintTo(const MalformedCase& c, std::ostream* os) { *os << c.name; }

class MalformedHeaderTest : public SafetensorsHeaderTest,
                            public ::testing::WithParamInterface<MalformedCase> {};

TEST_P(MalformedHeaderTest, IsRefusedNamingTheFileAndTensor) {
  const MalformedCase& c = GetParam();
  std::vector<std::string> fragments = {path_ + ": "};
  for (absl::string_view piece : absl::StrSplit(c.fragment, '%')) fragments.emplace_back(piece);
  EXPECT_THAT(ReadRaw(c.header, std::string(c.data_bytes, 'd')), RefusedWith(c.code, fragments));
}

INSTANTIATE_TEST_SUITE_P(Refused, MalformedHeaderTest, ::testing::ValuesIn(MalformedCases()),
                         [](const ::testing::TestParamInfo<MalformedCase>& info) {
                           return info.param.name;
                         });

// product(shape) × dtype size, computed exactly; nullopt when it does not fit 64 bits.
std::optional<uint64_t> ExactBytes(const SafetensorsTensor& tensor) {
  if (std::count(tensor.shape.begin(), tensor.shape.end(), 0) > 0) return 0;
  uint64_t bytes = DTypeSize(tensor.dtype);
  for (const uint64_t dim : tensor.shape) {
    if (__builtin_mul_overflow(bytes, dim, &bytes)) return std::nullopt;
  }
  return bytes;
}

TEST(SafetensorsHeaderFuzzTest, RandomMutationsNeverCrashAndOkResultsHoldTheInvariants) {
  struct Sample {
    std::string header;
    std::string data;
  };
  std::vector<Sample> samples;
  {
    std::vector<TensorSpec> specs = {
        RandomTensor("embed", "BF16", {4, 3}, 1), RandomTensor("empty", "F32", {0, 5}, 2),
        RandomTensor("bias", "F64", {3}, 3), RandomTensor("mask", "BOOL", {2, 2, 2}, 4),
        RandomTensor("scale", "F8_E4M3", {}, 5)};
    std::string data;
    for (const TensorSpec& spec : specs) data += spec.data;
    samples.push_back({testing::SafetensorsHeaderJson(specs, {{"format", "pt"}}), data});
    samples.push_back({testing::SafetensorsHeaderJson({specs[0]}), specs[0].data});
  }
  samples.push_back({R"({"__metadata__":{"a":"b","c":"[{"}})", ""});
  samples.push_back({R"({"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},)"
                     R"("z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                     R"("a":{"dtype":"I16","shape":[2],"data_offsets":[0,4]}})",
                     "01234567"});

  constexpr char kInteresting[] = "{}[]\",:-.0123456789eE\\ \xff";
  const char* const kNumbers[] = {"0",
                                  "-1",
                                  "-0",
                                  "1.5",
                                  "1e3",
                                  "18446744073709551615",
                                  "18446744073709551616",
                                  "9223372036854775808",
                                  "4294967296"};
  constexpr uint64_t kSeed = 0x5afe7e4508ull;
  constexpr int kCases = 50000;
  int ok = 0, invalid = 0, data_loss = 0;
  const auto started = std::chrono::steady_clock::now();
  for (int c = 0; c < kCases; ++c) {
    std::mt19937_64 rng(kSeed + c);  // one generator per case, so any case replays alone
    const auto below = [&](size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng() % n); };
    const Sample& sample = samples[below(samples.size())];
    std::string header = sample.header;
    for (int m = 1 + below(4); m > 0; --m) {
      const size_t pos = below(header.size() + 1);
      switch (below(6)) {
        case 0:
          if (pos < header.size()) header[pos] ^= static_cast<char>(1 << below(8));
          break;
        case 1:
          if (pos < header.size()) header[pos] = kInteresting[below(sizeof(kInteresting) - 1)];
          break;
        case 2:
          header.insert(pos, 1, kInteresting[below(sizeof(kInteresting) - 1)]);
          break;
        case 3:
          header.erase(pos, 1 + below(8));
          break;
        case 4:  // repeat a stretch, which makes duplicate keys and entries
          header.insert(below(header.size() + 1), header.substr(pos, 1 + below(60)));
          break;
        case 5: {
          const size_t digit = header.find_first_of("0123456789", pos);
          if (digit == std::string::npos) break;
          const size_t end = header.find_first_not_of("0123456789", digit);
          header.replace(digit, end - digit, kNumbers[below(std::size(kNumbers))]);
          break;
        }
      }
    }
    std::optional<uint64_t> declared;
    if (below(8) == 0) {
      const uint64_t choices[] = {rng(), header.size() + 1, header.size() - 1,
                                  kMaxSafetensorsHeaderBytes, kMaxSafetensorsHeaderBytes + 1};
      declared = choices[below(std::size(choices))];
    }
    std::string bytes = FileBytes(header, sample.data, declared);
    if (below(8) == 0) bytes.resize(below(bytes.size() + 1));
    const uint64_t file_size = bytes.size();
    // Sometimes hand over only what the contract asks for: the first min(file size, 8 + N).
    if (below(8) == 0 && !declared.has_value()) {
      bytes.resize(std::min(bytes.size(), 8 + header.size()));
    }

    const absl::StatusOr<SafetensorsHeader> result =
        ParseSafetensorsHeader("fuzz.safetensors", bytes, file_size);
    const auto context = [&] {
      return absl::StrCat("seed ", kSeed, " case ", c, ", file size ", file_size, ", bytes \"",
                          absl::CHexEscape(bytes.substr(0, 2000)), "\"");
    };
    if (!result.ok()) {
      const absl::StatusCode code = result.status().code();
      ASSERT_TRUE(code == kInvalid || code == kDataLoss) << result.status() << "; " << context();
      ASSERT_TRUE(absl::StartsWith(result.status().message(), "fuzz.safetensors: "))
          << result.status() << "; " << context();
      (code == kInvalid ? invalid : data_loss)++;
      continue;
    }
    ++ok;
    const SafetensorsHeader& h = *result;
    ASSERT_GE(h.data_start, 8u) << context();
    ASSERT_LE(h.data_start, file_size) << context();
    uint64_t furthest_end = h.data_start;
    for (size_t i = 0; i < h.tensors.size(); ++i) {
      const SafetensorsTensor& t = h.tensors[i];
      ASSERT_FALSE(t.name.empty()) << context();
      ASSERT_LE(t.shape.size(), 64u) << context();
      ASSERT_LE(h.data_start, t.begin) << context();
      ASSERT_LE(t.begin, t.end) << context();
      ASSERT_LE(t.end, file_size) << context();
      ASSERT_EQ(ExactBytes(t), t.size()) << t.name << "; " << context();
      if (i > 0) {
        const SafetensorsTensor& prev = h.tensors[i - 1];
        ASSERT_TRUE(std::tie(prev.begin, prev.name) < std::tie(t.begin, t.name)) << context();
      }
      if (t.size() > 0) {
        ASSERT_GE(t.begin, furthest_end) << t.name << " overlaps; " << context();
        furthest_end = t.end;
      }
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::cout << kCases << " mutated headers in " << seconds << " s: " << ok << " OK, " << invalid
            << " INVALID_ARGUMENT, " << data_loss << " DATA_LOSS\n";
  // Every outcome must actually be exercised, or the mutations have stopped reaching the parser.
  EXPECT_GT(ok, kCases / 100);
  EXPECT_GT(invalid, kCases / 10);
  EXPECT_GT(data_loss, kCases / 100);
}

}  // namespace
}  // namespace tierd
