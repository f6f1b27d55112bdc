#include "tests/s3_stub.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace tierd::testing {
namespace {

// The most a request's line and headers may take.
constexpr size_t kMaxRequestHead = 64 << 10;

std::string PercentDecode(absl::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    int value = 0;
    if (text[i] == '%' && i + 2 < text.size() &&
        absl::SimpleHexAtoi(text.substr(i + 1, 2), &value)) {
      out.push_back(static_cast<char>(value));
      i += 2;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

std::string XmlEscape(absl::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

const char* Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 206:
      return "Partial Content";
    case 304:
      return "Not Modified";
    case 400:
      return "Bad Request";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 412:
      return "Precondition Failed";
    case 416:
      return "Range Not Satisfiable";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Status";
  }
}

// Sleeps up to `duration`, in steps, until `stopping`.
void SleepUnless(absl::Duration duration, const std::atomic<bool>& stopping) {
  const absl::Time until = absl::Now() + duration;
  while (!stopping && absl::Now() < until) {
    absl::SleepFor(std::min(until - absl::Now(), absl::Milliseconds(20)));
  }
}

bool WriteAllTo(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// "bytes=A-B" → [A, B]; nullopt for anything else.
std::optional<std::pair<uint64_t, uint64_t>> ParseRange(absl::string_view value) {
  if (!absl::ConsumePrefix(&value, "bytes=")) return std::nullopt;
  const std::vector<absl::string_view> ends = absl::StrSplit(value, '-');
  uint64_t first = 0, last = 0;
  if (ends.size() != 2 || !absl::SimpleAtoi(ends[0], &first) || !absl::SimpleAtoi(ends[1], &last) ||
      last < first) {
    return std::nullopt;
  }
  return std::make_pair(first, last);
}

}  // namespace

std::string StubRequest::Header(const std::string& lower_case_name) const {
  auto it = headers.find(lower_case_name);
  return it == headers.end() ? "" : it->second;
}

StubAnswer StubAnswer::Error(int status, const std::string& code, const std::string& message) {
  StubAnswer answer;
  answer.status = status;
  answer.headers.emplace_back("Content-Type", "application/xml");
  answer.body = absl::StrCat("<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>", code,
                             "</Code><Message>", message, "</Message></Error>");
  return answer;
}

absl::StatusOr<std::unique_ptr<S3Stub>> S3Stub::Start() {
  std::unique_ptr<S3Stub> stub(new S3Stub());
  stub->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (stub->listen_fd_ < 0) return absl::InternalError("socket");
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (::bind(stub->listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(stub->listen_fd_, 128) != 0 ||
      ::getsockname(stub->listen_fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return absl::InternalError(absl::StrCat("listening: ", std::strerror(errno)));
  }
  stub->endpoint_.url = absl::StrCat("http://127.0.0.1:", ntohs(address.sin_port));
  stub->endpoint_.region = "us-east-1";
  stub->endpoint_.path_style = true;
  stub->credentials_.access_key_id = "AKIASTUBKEYID0123456";
  stub->credentials_.secret_access_key = "stubSecretKey/0123456789abcdefghijklmnopq";
  stub->credentials_.source = "the test";
  stub->acceptor_ = std::thread([s = stub.get()] { s->Accept(); });
  return stub;
}

S3Stub::~S3Stub() {
  stopping_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  acceptor_.join();
  ::close(listen_fd_);
  std::vector<std::thread> servers;
  {
    absl::MutexLock lock(&mu_);
    for (int fd : connections_) ::shutdown(fd, SHUT_RDWR);
    servers.swap(servers_);
  }
  for (std::thread& server : servers) server.join();
}

S3ClientOptions S3Stub::ClientOptions() const {
  S3ClientOptions options;
  options.endpoint = endpoint_;
  options.credentials = credentials_;
  options.connect_timeout = absl::Seconds(2);
  // Long enough that a machine busy with sanitized builds does not look like a stall.
  options.stall_timeout = absl::Seconds(5);
  options.max_attempts = 2;
  options.initial_backoff = absl::Milliseconds(5);
  options.max_backoff = absl::Milliseconds(20);
  return options;
}

std::string S3Stub::PutObject(const std::string& bucket, const std::string& key, std::string bytes,
                              std::string etag) {
  if (etag.empty()) etag = absl::StrFormat("%016x", XXH3_64bits(bytes.data(), bytes.size()));
  absl::MutexLock lock(&mu_);
  objects_[absl::StrCat(bucket, "/", key)] = Object{std::move(bytes), etag};
  return etag;
}

void S3Stub::SetHook(Hook hook) {
  absl::MutexLock lock(&mu_);
  hook_ = std::move(hook);
}

int S3Stub::requests() const {
  absl::MutexLock lock(&mu_);
  return requests_;
}

int S3Stub::requests_for(const std::string& method, const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = requests_by_key_.find({method, key});
  return it == requests_by_key_.end() ? 0 : it->second;
}

void S3Stub::Accept() {
  while (!stopping_) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // shut down
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (open_.load() >= kMaxConnections) {
      ::close(fd);
      continue;
    }
    const int open = ++open_;
    for (int seen = max_open_.load();
         open > seen && !max_open_.compare_exchange_weak(seen, open);) {
    }
    absl::MutexLock lock(&mu_);
    connections_.push_back(fd);
    servers_.emplace_back([this, fd] { Serve(fd); });
  }
}

void S3Stub::Serve(int fd) {
  std::string buffer;
  while (!stopping_) {
    // One request's head.
    size_t end;
    while ((end = buffer.find("\r\n\r\n")) == std::string::npos) {
      if (buffer.size() > kMaxRequestHead) break;
      char chunk[4096];
      const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        end = std::string::npos;
        break;
      }
      buffer.append(chunk, static_cast<size_t>(n));
    }
    if (end == std::string::npos) break;
    const std::string head = buffer.substr(0, end);
    buffer.erase(0, end + 4);
    std::vector<std::string> lines = absl::StrSplit(head, "\r\n");
    std::vector<std::string> first = absl::StrSplit(lines[0], ' ');
    if (first.size() < 2) break;
    StubRequest request;
    request.method = first[0];
    absl::string_view target = first[1];
    const size_t question = target.find('?');
    absl::string_view path = target.substr(0, question);
    if (question != absl::string_view::npos) {
      for (absl::string_view pair : absl::StrSplit(target.substr(question + 1), '&')) {
        if (pair.empty()) continue;
        const size_t equals = pair.find('=');
        request.query[PercentDecode(pair.substr(0, equals))] =
            equals == absl::string_view::npos ? "" : PercentDecode(pair.substr(equals + 1));
      }
    }
    absl::ConsumePrefix(&path, "/");
    const size_t slash = path.find('/');
    request.bucket = PercentDecode(path.substr(0, slash));
    if (slash != absl::string_view::npos) request.key = PercentDecode(path.substr(slash + 1));
    uint64_t content_length = 0;
    for (size_t i = 1; i < lines.size(); ++i) {
      const size_t colon = lines[i].find(':');
      if (colon == std::string::npos) continue;
      const std::string name = absl::AsciiStrToLower(lines[i].substr(0, colon));
      request.headers[name] =
          std::string(absl::StripAsciiWhitespace(absl::string_view(lines[i]).substr(colon + 1)));
      if (name == "content-length" && !absl::SimpleAtoi(request.headers[name], &content_length)) {
        content_length = 0;  // none of the client's requests has a body
      }
    }
    // A body (none of the client's requests has one) is read and dropped.
    while (buffer.size() < content_length) {
      char chunk[4096];
      const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
      if (n <= 0) break;
      buffer.append(chunk, static_cast<size_t>(n));
    }
    buffer.erase(0, std::min<size_t>(buffer.size(), content_length));

    Hook hook;
    {
      absl::MutexLock lock(&mu_);
      ++requests_;
      ++requests_by_key_[{request.method, request.key}];
      hook = hook_;
    }
    std::optional<StubAnswer> answer;
    if (hook) answer = hook(request);
    if (!answer) answer = Answer(request);
    if (!Send(fd, *answer, request.method == "HEAD")) break;
  }
  {
    absl::MutexLock lock(&mu_);
    connections_.erase(std::find(connections_.begin(), connections_.end(), fd));
  }
  ::close(fd);
  --open_;
}

bool S3Stub::Send(int fd, const StubAnswer& answer, bool head) {
  SleepUnless(answer.silence, stopping_);
  if (stopping_) return false;
  std::string text = absl::StrCat("HTTP/1.1 ", answer.status, " ", Reason(answer.status), "\r\n");
  bool has_length = false;
  for (const auto& [name, value] : answer.headers) {
    absl::StrAppend(&text, name, ": ", value, "\r\n");
    has_length |= absl::EqualsIgnoreCase(name, "Content-Length");
  }
  if (!has_length) absl::StrAppend(&text, "Content-Length: ", answer.body.size(), "\r\n");
  absl::StrAppend(&text, "\r\n");
  if (!WriteAllTo(fd, text)) return false;
  if (head) return true;
  absl::string_view body = answer.body;
  if (answer.close_after_bytes) body = body.substr(0, *answer.close_after_bytes);
  if (answer.bytes_per_second == 0) {
    if (!WriteAllTo(fd, body)) return false;
  } else {
    // A step every 50 ms, of a twentieth of the rate (at least a byte).
    const size_t step = std::max<uint64_t>(1, answer.bytes_per_second / 20);
    while (!body.empty() && !stopping_) {
      const absl::string_view piece = body.substr(0, step);
      if (!WriteAllTo(fd, piece)) return false;
      body.remove_prefix(piece.size());
      SleepUnless(absl::Milliseconds(1000.0 * piece.size() / answer.bytes_per_second), stopping_);
    }
  }
  return !answer.close_after_bytes.has_value();  // a cut answer closes its connection
}

StubAnswer S3Stub::Answer(const StubRequest& request) const {
  absl::MutexLock lock(&mu_);
  if (request.IsListing()) return ListObjects(request);
  return GetObject(request);
}

StubAnswer S3Stub::ListObjects(const StubRequest& request) const {
  const auto param = [&](const std::string& name) {
    auto it = request.query.find(name);
    return it == request.query.end() ? std::string() : it->second;
  };
  const std::string prefix = param("prefix");
  const std::string delimiter = param("delimiter");
  const std::string after = param("continuation-token");
  int max_keys = 1000;
  if (!param("max-keys").empty() && !absl::SimpleAtoi(param("max-keys"), &max_keys)) {
    max_keys = 1000;
  }
  std::string contents, prefixes, last;
  int count = 0;
  bool truncated = false;
  std::string last_prefix;
  const std::string bucket_start = absl::StrCat(request.bucket, "/");
  for (auto it = objects_.lower_bound(absl::StrCat(bucket_start, prefix)); it != objects_.end();
       ++it) {
    if (!absl::StartsWith(it->first, bucket_start)) break;
    const std::string key = it->first.substr(bucket_start.size());
    if (!absl::StartsWith(key, prefix)) break;
    if (!after.empty() && key <= after) continue;
    if (!delimiter.empty()) {
      const size_t at = key.find(delimiter, prefix.size());
      if (at != std::string::npos) {
        const std::string common = key.substr(0, at + delimiter.size());
        if (common == last_prefix) continue;
        if (count == max_keys) {
          truncated = true;
          break;
        }
        last_prefix = common;
        absl::StrAppend(&prefixes, "<CommonPrefixes><Prefix>", XmlEscape(common),
                        "</Prefix></CommonPrefixes>");
        last = key;
        ++count;
        continue;
      }
    }
    if (count == max_keys) {
      truncated = true;
      break;
    }
    absl::StrAppend(&contents, "<Contents><Key>", XmlEscape(key), "</Key><Size>",
                    it->second.bytes.size(), "</Size><ETag>&quot;", it->second.etag,
                    "&quot;</ETag></Contents>");
    last = key;
    ++count;
  }
  StubAnswer answer;
  answer.headers.emplace_back("Content-Type", "application/xml");
  answer.body = absl::StrCat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult><Name>", request.bucket,
      "</Name><Prefix>", XmlEscape(prefix), "</Prefix><KeyCount>", count,
      "</KeyCount><IsTruncated>", truncated ? "true" : "false", "</IsTruncated>",
      truncated
          ? absl::StrCat("<NextContinuationToken>", XmlEscape(last), "</NextContinuationToken>")
          : "",
      contents, prefixes, "</ListBucketResult>");
  return answer;
}

StubAnswer S3Stub::GetObject(const StubRequest& request) const {
  auto it = objects_.find(absl::StrCat(request.bucket, "/", request.key));
  if (it == objects_.end()) return StubAnswer::Error(404, "NoSuchKey", "no such key");
  const Object& object = it->second;
  const std::string quoted = absl::StrCat("\"", object.etag, "\"");
  const std::string if_match = request.Header("if-match");
  if (!if_match.empty() && if_match != quoted && if_match != object.etag) {
    return StubAnswer::Error(412, "PreconditionFailed", "at least one precondition failed");
  }
  StubAnswer answer;
  answer.headers.emplace_back("ETag", quoted);
  answer.headers.emplace_back("Last-Modified", "Sun, 06 Dec 2026 00:00:00 GMT");
  const std::string range = request.Header("range");
  if (range.empty() || request.method == "HEAD") {
    answer.body = object.bytes;
    if (request.method == "HEAD") {
      answer.headers.emplace_back("Content-Length", absl::StrCat(object.bytes.size()));
    }
    return answer;
  }
  const auto bounds = ParseRange(range);
  if (!bounds || bounds->first >= object.bytes.size()) {
    return StubAnswer::Error(416, "InvalidRange", "the range is not satisfiable");
  }
  const uint64_t last = std::min<uint64_t>(bounds->second, object.bytes.size() - 1);
  answer.status = 206;
  answer.headers.emplace_back(
      "Content-Range", absl::StrCat("bytes ", bounds->first, "-", last, "/", object.bytes.size()));
  answer.body = object.bytes.substr(bounds->first, last - bounds->first + 1);
  return answer;
}

std::string StubSafetensors(const std::vector<std::string>& names, uint64_t bytes_each,
                            uint64_t seed) {
  std::string header = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    absl::StrAppend(&header, i == 0 ? "" : ",", "\"", names[i], "\":{\"dtype\":\"U8\",\"shape\":[",
                    bytes_each, "],\"data_offsets\":[", i * bytes_each, ",", (i + 1) * bytes_each,
                    "]}");
  }
  header += "}";
  std::string file(8, '\0');
  for (int b = 0; b < 8; ++b) file[b] = static_cast<char>((header.size() >> (8 * b)) & 0xff);
  file += header;
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (uint64_t i = 0; i < names.size() * bytes_each; ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    file.push_back(static_cast<char>(state & 0xff));
  }
  return file;
}

}  // namespace tierd::testing
