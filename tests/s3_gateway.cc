#include "tests/s3_gateway.h"

#include <curl/curl.h>
#include <signal.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"

namespace tierd::testing {
namespace {

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

size_t Discard(char*, size_t size, size_t count, void*) { return size * count; }

struct Upload {
  absl::string_view bytes;
  size_t sent = 0;
  static size_t Read(char* buffer, size_t size, size_t count, void* user) {
    auto& upload = *static_cast<Upload*>(user);
    const size_t n = std::min(size * count, upload.bytes.size() - upload.sent);
    std::memcpy(buffer, upload.bytes.data() + upload.sent, n);
    upload.sent += n;
    return n;
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<S3Gateway>> S3Gateway::Start(int memory_mib) {
  std::unique_ptr<S3Gateway> gateway(new S3Gateway());
  gateway->cluster_dir_ = absl::StrCat(gateway->dir_.path(), "/cluster");
  absl::StatusOr<RunResult> started =
      RunProgramWithStderr({"/bin/bash", TIERD_S3_GATEWAY_SCRIPT, "start", gateway->cluster_dir_,
                            "--memory-mib", absl::StrCat(memory_mib)},
                           absl::Seconds(120));
  if (!started.ok()) return started.status();
  if (started->exit_code != 0) {
    return absl::UnavailableError(absl::StrCat("the S3 gateway did not start:\n", started->output));
  }
  absl::StatusOr<std::string> env = ReadWholeFile(absl::StrCat(gateway->cluster_dir_, "/s3.env"));
  if (!env.ok()) return env.status();
  gateway->env_file_ = *env;
  for (absl::string_view line : absl::StrSplit(*env, '\n', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
    if (kv.first == "S3_ENDPOINT") gateway->endpoint_.url = kv.second;
    if (kv.first == "AWS_ACCESS_KEY_ID") gateway->credentials_.access_key_id = kv.second;
    if (kv.first == "AWS_SECRET_ACCESS_KEY") gateway->credentials_.secret_access_key = kv.second;
    if (kv.first == "AWS_REGION") gateway->endpoint_.region = kv.second;
  }
  gateway->credentials_.source = "the test gateway's user";
  gateway->endpoint_.path_style = true;
  return gateway;
}

S3Gateway::~S3Gateway() {
  absl::StatusOr<RunResult> stopped = RunProgramWithStderr(
      {"/bin/bash", TIERD_S3_GATEWAY_SCRIPT, "stop", cluster_dir_}, absl::Seconds(60));
  EXPECT_TRUE(stopped.ok() && stopped->exit_code == 0)
      << "stopping the S3 gateway: "
      << (stopped.ok() ? stopped->output : stopped.status().ToString());
}

S3ClientOptions S3Gateway::ClientOptions() const {
  S3ClientOptions options;
  options.endpoint = endpoint_;
  options.credentials = credentials_;
  options.connect_timeout = absl::Seconds(2);
  options.stall_timeout = absl::Seconds(2);
  options.max_attempts = 3;
  options.initial_backoff = absl::Milliseconds(20);
  options.max_backoff = absl::Milliseconds(200);
  return options;
}

absl::Status S3Gateway::Send(const std::string& method, const std::string& bucket,
                             const std::string& key, absl::string_view body) {
  absl::StatusOr<std::string> url = S3ObjectHttpUrl(endpoint_, bucket, key);
  if (!url.ok()) return url.status();
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return absl::InternalError("curl_easy_init");
  const std::string sigv4 = absl::StrCat("aws:amz:", endpoint_.region, ":s3");
  curl_slist* headers = curl_slist_append(nullptr, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  Upload upload{body};
  curl_easy_setopt(curl, CURLOPT_URL, url->c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4.c_str());
  curl_easy_setopt(curl, CURLOPT_USERNAME, credentials_.access_key_id.c_str());
  curl_easy_setopt(curl, CURLOPT_PASSWORD, credentials_.secret_access_key.c_str());
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, 120L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Discard);
  if (method == "PUT") {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, &Upload::Read);
    curl_easy_setopt(curl, CURLOPT_READDATA, &upload);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(body.size()));
  } else {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
  }
  const CURLcode code = curl_easy_perform(curl);
  long http = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &http);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  if (code != CURLE_OK) {
    return absl::UnavailableError(absl::StrCat(method, " ", *url, ": ", curl_easy_strerror(code)));
  }
  if (http < 200 || http >= 300) {
    return absl::UnknownError(absl::StrCat(method, " ", *url, ": HTTP ", http));
  }
  return absl::OkStatus();
}

absl::Status S3Gateway::CreateBucket(const std::string& bucket) {
  return Send("PUT", bucket, "", "");
}

absl::Status S3Gateway::PutObject(const std::string& bucket, const std::string& key,
                                  absl::string_view bytes) {
  return Send("PUT", bucket, key, bytes);
}

absl::Status S3Gateway::DeleteObject(const std::string& bucket, const std::string& key) {
  return Send("DELETE", bucket, key, "");
}

absl::StatusOr<pid_t> S3Gateway::GatewayPid() const {
  absl::StatusOr<std::string> text =
      ReadWholeFile(absl::StrCat(cluster_dir_, "/run/rgw.daemon-pid"));
  if (!text.ok()) return text.status();
  pid_t pid;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &pid)) {
    return absl::InternalError("the gateway's pid file holds no pid");
  }
  return pid;
}

absl::Status S3Gateway::Pause() {
  absl::StatusOr<pid_t> pid = GatewayPid();
  if (!pid.ok()) return pid.status();
  return ::kill(*pid, SIGSTOP) == 0 ? absl::OkStatus() : absl::InternalError("SIGSTOP");
}

absl::Status S3Gateway::Resume() {
  absl::StatusOr<pid_t> pid = GatewayPid();
  if (!pid.ok()) return pid.status();
  return ::kill(*pid, SIGCONT) == 0 ? absl::OkStatus() : absl::InternalError("SIGCONT");
}

absl::Status S3Gateway::StopGateway() {
  absl::StatusOr<pid_t> pid = GatewayPid();
  if (!pid.ok()) return pid.status();
  ::kill(*pid, SIGCONT);
  if (::kill(*pid, SIGKILL) != 0) return absl::InternalError("SIGKILL");
  return absl::OkStatus();
}

}  // namespace tierd::testing
