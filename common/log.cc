#include "common/log.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tierd {
namespace {

std::atomic<int> g_verbosity{0};

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kINFO:
      return "I";
    case LogLevel::kWARNING:
      return "W";
    case LogLevel::kERROR:
      return "E";
  }
  return "?";
}

const char* BaseName(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash == nullptr ? path : slash + 1;
}

}  // namespace

void SetLogVerbosity(int verbosity) { g_verbosity.store(verbosity, std::memory_order_relaxed); }
int LogVerbosity() { return g_verbosity.load(std::memory_order_relaxed); }

LogRateLimit::LogRateLimit(double period_seconds)
    : period_ns_(static_cast<int64_t>(period_seconds * 1e9)) {}

int64_t LogRateLimit::Take() {
  const int64_t now = absl::GetCurrentTimeNanos();
  int64_t next = next_ns_.load(std::memory_order_relaxed);
  // One caller wins the slot; the others are held back and counted.
  if (now < next || !next_ns_.compare_exchange_strong(next, now + period_ns_)) {
    held_back_.fetch_add(1, std::memory_order_relaxed);
    return -1;
  }
  return held_back_.exchange(0, std::memory_order_relaxed);
}

std::ostream& operator<<(std::ostream& out, LinesLeftOut left_out) {
  if (left_out.count > 0) out << "(" << left_out.count << " similar lines left out) ";
  return out;
}

LogLine::LogLine(LogLevel level, const char* file, int line) {
  prefix_ = absl::StrCat(LevelName(level),
                         absl::FormatTime("%m%d %H:%M:%E6S ", absl::Now(), absl::LocalTimeZone()),
                         BaseName(file), ":", line, "] ");
}

LogLine::~LogLine() {
  const std::string message = stream_.str();
  // One event, one line, whatever the message holds: a client's string with a newline must not
  // forge a line, nor a control byte reach the terminal, nor a megabyte flood the log.
  std::string text = prefix_;
  text.reserve(prefix_.size() + std::min(message.size(), kMaxLogMessageBytes) + 32);
  for (size_t i = 0; i < message.size() && i < kMaxLogMessageBytes; ++i) {
    const unsigned char c = static_cast<unsigned char>(message[i]);
    if (c == '\n') {
      text += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      absl::StrAppendFormat(&text, "\\x%02x", c);
    } else {
      text += static_cast<char>(c);
    }
  }
  if (message.size() > kMaxLogMessageBytes) {
    absl::StrAppend(&text, "... (", message.size(), " bytes)");
  }
  text += '\n';
  // One write per line keeps lines from different threads whole.
  ssize_t ignored = ::write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
}

}  // namespace tierd
