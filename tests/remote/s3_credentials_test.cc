#include "remote/s3_credentials.h"

#include <sys/stat.h>

#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;

class S3CredentialsTest : public ::testing::Test {
 protected:
  S3CredentialOptions Options() {
    S3CredentialOptions options;
    options.getenv = [this](const char* name) -> std::optional<std::string> {
      auto it = env_.find(name);
      if (it == env_.end()) return std::nullopt;
      return it->second;
    };
    return options;
  }
  std::string Write(const std::string& name, const std::string& text, mode_t mode = 0600) {
    const std::string path = absl::StrCat(dir_.path(), "/", name);
    std::ofstream(path) << text;
    ::chmod(path.c_str(), mode);
    return path;
  }

  testing::TempDir dir_;
  std::map<std::string, std::string> env_{{"HOME", dir_.path()}};
};

TEST_F(S3CredentialsTest, TheEnvironmentComesBeforeTheSharedFiles) {
  env_["AWS_SHARED_CREDENTIALS_FILE"] =
      Write("credentials", "[default]\naws_access_key_id = FILEKEY\naws_secret_access_key = s\n");
  env_["AWS_ACCESS_KEY_ID"] = "ENVKEY1234";
  env_["AWS_SECRET_ACCESS_KEY"] = "env-secret";
  env_["AWS_SESSION_TOKEN"] = "token";
  absl::StatusOr<S3Credentials> found = ResolveS3Credentials(Options());
  ASSERT_THAT(found, IsOk());
  EXPECT_EQ(found->access_key_id, "ENVKEY1234");
  EXPECT_EQ(found->secret_access_key, "env-secret");
  EXPECT_EQ(found->session_token, "token");
  EXPECT_EQ(found->Describe(), "ENVK… from the environment");
  EXPECT_THAT(found->Describe(), Not(HasSubstr("env-secret")));
}

TEST_F(S3CredentialsTest, ProfilesOfTheSharedCredentialsAndConfigFiles) {
  ::mkdir(absl::StrCat(dir_.path(), "/.aws").c_str(), 0700);
  Write(".aws/credentials",
        "# comment\n[default]\naws_access_key_id=DEFAULTKEY\naws_secret_access_key=d\n"
        "[models]\n  aws_access_key_id = MODELSKEY \n aws_secret_access_key = m\n");
  Write(".aws/config",
        "[default]\nregion = eu-west-1\n[profile cfg]\naws_access_key_id = CFGKEY\n"
        "aws_secret_access_key = c\nregion = ap-south-1\n");
  EXPECT_EQ(ResolveS3Credentials(Options())->access_key_id, "DEFAULTKEY");
  EXPECT_EQ(ResolveS3Region(Options()), "eu-west-1");
  env_["AWS_PROFILE"] = "models";
  EXPECT_EQ(ResolveS3Credentials(Options())->access_key_id, "MODELSKEY");
  env_["AWS_PROFILE"] = "cfg";
  EXPECT_EQ(ResolveS3Credentials(Options())->access_key_id, "CFGKEY");
  EXPECT_EQ(ResolveS3Region(Options()), "ap-south-1");
  env_["AWS_REGION"] = "us-west-2";
  EXPECT_EQ(ResolveS3Region(Options()), "us-west-2");
  env_["AWS_PROFILE"] = "none";
  EXPECT_THAT(ResolveS3Credentials(Options()), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(S3CredentialsTest, AFileGivenByFlagMustBeTheOwnersOnly) {
  S3CredentialOptions options = Options();
  options.credentials_file = Write(
      "tierd-s3", "[default]\naws_access_key_id = FLAGKEY\naws_secret_access_key = f\n", 0644);
  env_["AWS_ACCESS_KEY_ID"] = "ENVKEY";
  env_["AWS_SECRET_ACCESS_KEY"] = "e";
  absl::StatusOr<S3Credentials> refused = ResolveS3Credentials(options);
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(refused.status().message(), HasSubstr("chmod 600"));
  ::chmod(options.credentials_file.c_str(), 0600);
  absl::StatusOr<S3Credentials> found = ResolveS3Credentials(options);
  ASSERT_THAT(found, IsOk());
  EXPECT_EQ(found->access_key_id, "FLAGKEY");  // the flag's file before the environment
  options.profile = "other";
  EXPECT_THAT(ResolveS3Credentials(options), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(S3CredentialsTest, HalfACredentialOrNoneSaysWhereItLookedAndNeverQuotesASecret) {
  EXPECT_THAT(ResolveS3Credentials(Options()), StatusIs(absl::StatusCode::kNotFound));
  env_["AWS_SECRET_ACCESS_KEY"] = "only-the-secret";
  absl::StatusOr<S3Credentials> half = ResolveS3Credentials(Options());
  EXPECT_THAT(half, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(half.status().message(), Not(HasSubstr("only-the-secret")));
  env_.erase("AWS_SECRET_ACCESS_KEY");
  env_["AWS_SHARED_CREDENTIALS_FILE"] =
      Write("broken", "[default]\naws_secret_access_key secret-without-equals\n");
  absl::StatusOr<S3Credentials> broken = ResolveS3Credentials(Options());
  EXPECT_THAT(broken, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(broken.status().message(), HasSubstr(":2:"));
  EXPECT_THAT(broken.status().message(), Not(HasSubstr("secret-without-equals")));
}

}  // namespace
}  // namespace tierd
