#include "common/log.h"

#include <unistd.h>

#include <cstring>

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

LogLine::LogLine(LogLevel level, const char* file, int line) {
  stream_ << LevelName(level)
          << absl::FormatTime("%m%d %H:%M:%E6S ", absl::Now(), absl::LocalTimeZone())
          << BaseName(file) << ':' << line << "] ";
}

LogLine::~LogLine() {
  stream_ << '\n';
  const std::string text = stream_.str();
  // One write per line keeps lines from different threads whole.
  ssize_t ignored = ::write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
}

}  // namespace tierd
