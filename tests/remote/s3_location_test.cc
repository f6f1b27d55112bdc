#include "remote/s3_location.h"

#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOk;
using ::tierd::testing::IsOkAndHolds;
using ::tierd::testing::StatusIs;

TEST(S3UrlTest, ABucketAndAKeyOrPrefix) {
  absl::StatusOr<S3Url> url = ParseS3Url("s3://models-eu.1/llama/3.1 8b/model.safetensors");
  ASSERT_THAT(url, IsOk());
  EXPECT_EQ(url->bucket, "models-eu.1");
  EXPECT_EQ(url->key, "llama/3.1 8b/model.safetensors");
  EXPECT_EQ(url->ToString(), "s3://models-eu.1/llama/3.1 8b/model.safetensors");
  EXPECT_THAT(ParseS3Url("s3://bucket"), IsOk());
  EXPECT_EQ(ParseS3Url("s3://bucket/")->key, "");
  EXPECT_TRUE(IsS3Path("s3://b"));
  EXPECT_FALSE(IsS3Path("/models/s3://b"));
}

TEST(S3UrlTest, WhatS3WouldNotAcceptIsRefusedSayingWhy) {
  for (const char* bad :
       {"http://bucket/key", "s3://", "s3://ab/key", "s3://Bucket/key", "s3://bucket_1/key",
        "s3://-bucket/key", "s3://bucket-/key", "s3://buck..et/key", "s3://bucket/a/../b",
        "s3://bucket/./a", "s3://bucket/a\nb"}) {
    EXPECT_THAT(ParseS3Url(bad), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
  EXPECT_THAT(ParseS3Url(std::string("s3://bucket/") + std::string(1025, 'k')),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(S3EndpointTest, PathStyleVirtualHostedAndAwsByRegion) {
  S3Endpoint endpoint{"http://127.0.0.1:7480", "us-east-1", /*path_style=*/true};
  EXPECT_THAT(S3ObjectHttpUrl(endpoint, "b1", "m/a b+c.bin"),
              IsOkAndHolds(std::string("http://127.0.0.1:7480/b1/m/a%20b%2Bc.bin")));
  endpoint = {"https://objects.example.com", "eu-west-1", /*path_style=*/false};
  EXPECT_THAT(S3ObjectHttpUrl(endpoint, "b1", "k"),
              IsOkAndHolds(std::string("https://b1.objects.example.com/k")));
  endpoint = {"", "eu-west-1", /*path_style=*/false};
  EXPECT_THAT(S3EndpointUrl(endpoint),
              IsOkAndHolds(std::string("https://s3.eu-west-1.amazonaws.com")));
  for (const char* bad :
       {"ftp://host", "http://", "http://host/path", "https://user@host", "host:7480"}) {
    endpoint = {bad, "us-east-1", true};
    EXPECT_THAT(S3EndpointUrl(endpoint), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
}

TEST(S3EndpointTest, KeysAreEncodedAsSigV4SignsThem) {
  EXPECT_EQ(S3UriEncode("a-b_c.d~e/f g", /*keep_slash=*/true), "a-b_c.d~e/f%20g");
  EXPECT_EQ(S3UriEncode("m/", /*keep_slash=*/false), "m%2F");
  EXPECT_EQ(S3UriEncode("\xc3\xa9", /*keep_slash=*/false), "%C3%A9");
}

}  // namespace
}  // namespace tierd
