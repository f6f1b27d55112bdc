// A real S3 endpoint for a test: Ceph's RADOS Gateway on 127.0.0.1, started by
// deploy/s3-gateway.sh in a directory of its own and stopped when this goes; and what a test does
// to it besides reading (making buckets, uploading objects, pausing, killing and restarting the
// gateway's process), and a proxy that throttles it and cuts its answers short.
#ifndef TIERD_TESTS_S3_GATEWAY_H_
#define TIERD_TESTS_S3_GATEWAY_H_

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "remote/s3_client.h"
#include "tests/test_support.h"

namespace tierd::testing {

class S3Gateway {
 public:
  // Starts a gateway whose store holds up to `memory_mib` MiB in memory (keep the data it is
  // given under two thirds of that), with `buckets` made.
  static absl::StatusOr<std::unique_ptr<S3Gateway>> Start(
      const std::vector<std::string>& buckets = {}, int memory_mib = 512);
  ~S3Gateway();
  S3Gateway(const S3Gateway&) = delete;
  S3Gateway& operator=(const S3Gateway&) = delete;

  // Its endpoint, path-style, and the keys of its S3 user.
  const S3Endpoint& endpoint() const { return endpoint_; }
  // The same gateway over HTTPS, and the self-signed certificate it presents there (a CA file).
  const S3Endpoint& tls_endpoint() const { return tls_endpoint_; }
  const std::string& ca_file() const { return ca_file_; }
  const S3Credentials& credentials() const { return credentials_; }
  // Client options for this gateway, with short timeouts and backoffs a test can wait out.
  S3ClientOptions ClientOptions() const;
  // The environment variables of its S3 user ("AWS_ACCESS_KEY_ID=…" lines, as s3.env has them).
  const std::string& env_file() const { return env_file_; }

  absl::Status CreateBucket(const std::string& bucket);
  absl::Status PutObject(const std::string& bucket, const std::string& key,
                         absl::string_view bytes);
  absl::Status DeleteObject(const std::string& bucket, const std::string& key);

  // SIGSTOP / SIGCONT to the gateway's process: requests stall, then go on. Pause returns once
  // every thread of the gateway has stopped.
  absl::Status Pause();
  absl::Status Resume();
  // Stops the gateway's process only (the cluster stays); requests are refused from then on,
  // until RestartGateway starts it again on the same port, the objects as they were.
  absl::Status StopGateway();
  absl::Status RestartGateway();

 private:
  S3Gateway() = default;
  absl::Status Send(const std::string& method, const std::string& bucket, const std::string& key,
                    absl::string_view body);
  absl::StatusOr<pid_t> GatewayPid() const;

  TempDir dir_;
  std::string cluster_dir_;
  std::string env_file_;
  S3Endpoint endpoint_;
  S3Endpoint tls_endpoint_;
  std::string ca_file_;
  S3Credentials credentials_;
};

// A TCP proxy on 127.0.0.1 in front of a gateway that throttles and cuts answers short: the first
// `connections_to_throttle` connections it accepts are answered "503 SlowDown" (S3's throttling)
// to their first request and closed; each of the next `connections_to_cut` is closed, both ways,
// once `cut_after_bytes` bytes of answer have gone through it; later connections pass whole. What
// a busy store, a flaky network or a restarted load balancer does to a download. One thread per
// connection; stopped when this goes.
class CuttingProxy {
 public:
  static absl::StatusOr<std::unique_ptr<CuttingProxy>> Start(const S3Endpoint& target,
                                                             int connections_to_cut,
                                                             uint64_t cut_after_bytes,
                                                             int connections_to_throttle = 0);
  ~CuttingProxy();
  CuttingProxy(const CuttingProxy&) = delete;
  CuttingProxy& operator=(const CuttingProxy&) = delete;

  // The gateway's endpoint, through this proxy.
  const S3Endpoint& endpoint() const { return endpoint_; }
  int connections_cut() const { return connections_cut_.load(); }
  int connections_throttled() const { return connections_throttled_.load(); }

 private:
  CuttingProxy() = default;
  void Accept();
  void Pump(int client, int upstream, bool cut);
  void Throttle(int client);

  S3Endpoint endpoint_;
  int target_port_ = 0;
  int listen_fd_ = -1;
  uint64_t cut_after_bytes_ = 0;
  std::atomic<int> connections_to_cut_{0};
  std::atomic<int> connections_cut_{0};
  std::atomic<int> connections_to_throttle_{0};
  std::atomic<int> connections_throttled_{0};
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  absl::Mutex mu_;
  std::vector<std::thread> pumps_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tierd::testing

#endif  // TIERD_TESTS_S3_GATEWAY_H_
