// A real S3 endpoint for a test: Ceph's RADOS Gateway on 127.0.0.1, started by
// deploy/s3-gateway.sh in a directory of its own and stopped when this goes; and what a test does
// to it besides reading (making buckets, uploading objects, pausing the gateway's process).
#ifndef TIERD_TESTS_S3_GATEWAY_H_
#define TIERD_TESTS_S3_GATEWAY_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "remote/s3_client.h"
#include "tests/test_support.h"

namespace tierd::testing {

class S3Gateway {
 public:
  // Starts a gateway whose store holds up to `memory_mib` MiB in memory (keep the data it is
  // given under two thirds of that).
  static absl::StatusOr<std::unique_ptr<S3Gateway>> Start(int memory_mib = 512);
  ~S3Gateway();
  S3Gateway(const S3Gateway&) = delete;
  S3Gateway& operator=(const S3Gateway&) = delete;

  // Its endpoint, path-style, and the keys of its S3 user.
  const S3Endpoint& endpoint() const { return endpoint_; }
  const S3Credentials& credentials() const { return credentials_; }
  // Client options for this gateway, with short timeouts and backoffs a test can wait out.
  S3ClientOptions ClientOptions() const;
  // The environment variables of its S3 user ("AWS_ACCESS_KEY_ID=…" lines, as s3.env has them).
  const std::string& env_file() const { return env_file_; }

  absl::Status CreateBucket(const std::string& bucket);
  absl::Status PutObject(const std::string& bucket, const std::string& key,
                         absl::string_view bytes);
  absl::Status DeleteObject(const std::string& bucket, const std::string& key);

  // SIGSTOP / SIGCONT to the gateway's process: requests stall, then go on.
  absl::Status Pause();
  absl::Status Resume();
  // Stops the gateway's process only (the cluster stays); requests are refused from then on.
  absl::Status StopGateway();

 private:
  S3Gateway() = default;
  absl::Status Send(const std::string& method, const std::string& bucket, const std::string& key,
                    absl::string_view body);
  absl::StatusOr<pid_t> GatewayPid() const;

  TempDir dir_;
  std::string cluster_dir_;
  std::string env_file_;
  S3Endpoint endpoint_;
  S3Credentials credentials_;
};

}  // namespace tierd::testing

#endif  // TIERD_TESTS_S3_GATEWAY_H_
