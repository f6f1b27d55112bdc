// The keys tierd signs S3 requests with, found where an operator expects them, as the AWS SDKs and
// CLI look: a credentials file named by flag (--s3-credentials-file), then the environment
// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), then the shared credentials file
// (AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials) and the shared config file
// (AWS_CONFIG_FILE, else ~/.aws/config), in the profile AWS_PROFILE names (else "default").
//
// A secret never leaves this struct in text: Describe() names the source and the key id's first
// characters only, and no error message quotes a file's lines.
#ifndef TIERD_REMOTE_S3_CREDENTIALS_H_
#define TIERD_REMOTE_S3_CREDENTIALS_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace tierd {

struct S3Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // temporary credentials' token; empty for long-term keys
  std::string source;         // where they were found, for messages: "the environment", a file

  // "AKIA… from the environment": safe to log.
  std::string Describe() const;
};

struct S3CredentialOptions {
  // --s3-credentials-file: a file in the shared credentials format, readable by its owner only
  // (its mode grants nothing to group or others; PERMISSION_DENIED otherwise). Empty: none.
  std::string credentials_file;
  // The profile to read; empty: AWS_PROFILE, else "default".
  std::string profile;
  // Reads an environment variable; null: the process's environment.
  std::function<std::optional<std::string>(const char* name)> getenv;
};

// The credentials, from the first source that has them. NOT_FOUND naming every place looked in
// when none does; PERMISSION_DENIED for a credentials file others may read; INVALID_ARGUMENT for a
// source with a key id but no secret (or the reverse), or a profile a file does not have.
absl::StatusOr<S3Credentials> ResolveS3Credentials(const S3CredentialOptions& options);

// The region configured for the profile: AWS_REGION, AWS_DEFAULT_REGION, else the shared config
// file's "region" of the profile; nullopt when none says.
std::optional<std::string> ResolveS3Region(const S3CredentialOptions& options);

// The AWS_* variables of the process's environment as they are now, for S3CredentialOptions'
// getenv: credentials found again later (after a refusal) still see them once they have left the
// environment. Other names read the environment.
std::function<std::optional<std::string>(const char* name)> SnapshotS3Environment();

// Removes the secrets — AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN — from the process's
// environment, their bytes overwritten first: a child process, /proc/PID/environ and a core file
// would show them. Call once they are read (SnapshotS3Environment). Not thread-safe against
// other readers of the environment.
void ForgetS3SecretsInEnvironment();

}  // namespace tierd

#endif  // TIERD_REMOTE_S3_CREDENTIALS_H_
