#include "tests/s3_gateway.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
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

// Whether every thread of `pid` is in the stopped state ('T' in /proc/PID/task/TID/stat).
absl::StatusOr<bool> AllThreadsStopped(pid_t pid) {
  const std::string tasks = absl::StrCat("/proc/", pid, "/task");
  DIR* dir = ::opendir(tasks.c_str());
  if (dir == nullptr) return absl::NotFoundError(absl::StrCat("cannot list ", tasks));
  bool all_stopped = true;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    absl::StatusOr<std::string> stat =
        ReadWholeFile(absl::StrCat(tasks, "/", entry->d_name, "/stat"));
    if (!stat.ok()) continue;  // the thread has exited
    // "TID (comm) STATE ...": the state follows the last ')', as comm may hold one.
    const size_t paren = stat->rfind(')');
    if (paren == std::string::npos || paren + 2 >= stat->size() || (*stat)[paren + 2] != 'T') {
      all_stopped = false;
      break;
    }
  }
  ::closedir(dir);
  return all_stopped;
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

absl::StatusOr<std::unique_ptr<S3Gateway>> S3Gateway::Start(const std::vector<std::string>& buckets,
                                                            int memory_mib) {
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
    if (kv.first == "S3_TLS_ENDPOINT") gateway->tls_endpoint_.url = kv.second;
    if (kv.first == "S3_CA_FILE") gateway->ca_file_ = kv.second;
  }
  gateway->credentials_.source = "the test gateway's user";
  gateway->endpoint_.path_style = true;
  gateway->tls_endpoint_.region = gateway->endpoint_.region;
  gateway->tls_endpoint_.path_style = true;
  for (const std::string& bucket : buckets) {
    absl::Status made = gateway->CreateBucket(bucket);
    if (!made.ok()) return made;
  }
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
  options.stall_timeout = absl::Seconds(1);
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
  if (::kill(*pid, SIGSTOP) != 0) return absl::InternalError("SIGSTOP");
  // kill() returns before the stop has reached every thread: until it has, a worker thread that
  // is already running may still answer a request. Wait until each one shows as stopped.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    absl::StatusOr<bool> stopped = AllThreadsStopped(*pid);
    if (!stopped.ok()) return stopped.status();
    if (*stopped) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(1));
  }
  return absl::DeadlineExceededError("the gateway's threads did not all stop within 10 s");
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
  // Gone once its pid answers no more (it is the script's child, not ours: nothing to reap).
  for (const absl::Time deadline = absl::Now() + absl::Seconds(10); absl::Now() < deadline;) {
    if (::kill(*pid, 0) != 0) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError("the gateway did not exit within 10 s of SIGKILL");
}

absl::Status S3Gateway::RestartGateway() {
  absl::StatusOr<RunResult> started = RunProgramWithStderr(
      {"/bin/bash", TIERD_S3_GATEWAY_SCRIPT, "restart-gateway", cluster_dir_}, absl::Seconds(90));
  if (!started.ok()) return started.status();
  if (started->exit_code != 0) {
    return absl::UnavailableError(
        absl::StrCat("the S3 gateway did not restart:\n", started->output));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CuttingProxy>> CuttingProxy::Start(const S3Endpoint& target,
                                                                  int connections_to_cut,
                                                                  uint64_t cut_after_bytes,
                                                                  int connections_to_throttle) {
  std::unique_ptr<CuttingProxy> proxy(new CuttingProxy());
  const size_t colon = target.url.rfind(':');
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(absl::StripSuffix(target.url.substr(colon + 1), "/"),
                        &proxy->target_port_)) {
    return absl::InvalidArgumentError(absl::StrCat("no port in ", target.url));
  }
  proxy->cut_after_bytes_ = cut_after_bytes;
  proxy->connections_to_cut_ = connections_to_cut;
  proxy->connections_to_throttle_ = connections_to_throttle;
  proxy->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (proxy->listen_fd_ < 0) return absl::InternalError("socket");
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (::bind(proxy->listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(proxy->listen_fd_, 64) != 0 ||
      ::getsockname(proxy->listen_fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return absl::InternalError("binding the proxy");
  }
  proxy->endpoint_ = target;
  proxy->endpoint_.url = absl::StrCat("http://127.0.0.1:", ntohs(address.sin_port));
  proxy->acceptor_ = std::thread([p = proxy.get()] { p->Accept(); });
  return proxy;
}

CuttingProxy::~CuttingProxy() {
  stopping_ = true;
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::thread> pumps;
  {
    absl::MutexLock lock(&mu_);
    pumps.swap(pumps_);
  }
  for (std::thread& pump : pumps) pump.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void CuttingProxy::Accept() {
  while (!stopping_) {
    pollfd ready = {listen_fd_, POLLIN, 0};
    if (::poll(&ready, 1, 50) <= 0) continue;
    const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    if (connections_to_throttle_.fetch_sub(1) > 0) {
      absl::MutexLock lock(&mu_);
      pumps_.emplace_back([this, client] { Throttle(client); });
      continue;
    }
    const int upstream = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address = {};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(target_port_));
    if (upstream < 0 ||
        ::connect(upstream, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      ::close(client);
      if (upstream >= 0) ::close(upstream);
      continue;
    }
    const bool cut = connections_to_cut_.fetch_sub(1) > 0;
    absl::MutexLock lock(&mu_);
    pumps_.emplace_back([this, client, upstream, cut] { Pump(client, upstream, cut); });
  }
}

void CuttingProxy::Throttle(int client) {
  // The request's head, up to its blank line (a GET has no body), then S3's throttling answer.
  std::string request;
  char buffer[4096];
  while (!stopping_ && request.find("\r\n\r\n") == std::string::npos) {
    pollfd ready = {client, POLLIN, 0};
    if (::poll(&ready, 1, 50) <= 0) continue;
    const ssize_t n = ::read(client, buffer, sizeof(buffer));
    if (n <= 0) break;
    request.append(buffer, n);
  }
  const std::string body =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code><Message>Please "
      "reduce your request rate.</Message></Error>";
  const std::string answer = absl::StrCat(
      "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: ", body.size(),
      "\r\nConnection: close\r\n\r\n", body);
  if (::send(client, answer.data(), answer.size(), MSG_NOSIGNAL) ==
      static_cast<ssize_t>(answer.size())) {
    ++connections_throttled_;
  }
  ::shutdown(client, SHUT_RDWR);
  ::close(client);
}

void CuttingProxy::Pump(int client, int upstream, bool cut) {
  uint64_t answered = 0;
  char buffer[16384];
  while (!stopping_) {
    pollfd ready[2] = {{client, POLLIN, 0}, {upstream, POLLIN, 0}};
    if (::poll(ready, 2, 50) <= 0) continue;
    if (ready[0].revents != 0) {  // a request
      const ssize_t n = ::read(client, buffer, sizeof(buffer));
      if (n <= 0 || ::send(upstream, buffer, n, MSG_NOSIGNAL) != n) break;
    }
    if (ready[1].revents != 0) {  // an answer
      size_t most = sizeof(buffer);
      if (cut) most = std::min<uint64_t>(most, cut_after_bytes_ - answered);
      const ssize_t n = ::read(upstream, buffer, most);
      if (n <= 0 || ::send(client, buffer, n, MSG_NOSIGNAL) != n) break;
      answered += n;
      if (cut && answered >= cut_after_bytes_) {
        ++connections_cut_;
        break;
      }
    }
  }
  ::shutdown(client, SHUT_RDWR);
  ::shutdown(upstream, SHUT_RDWR);
  ::close(client);
  ::close(upstream);
}

}  // namespace tierd::testing
