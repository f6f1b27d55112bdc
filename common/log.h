// Minimal leveled logging to stderr: one line per event, with time, level and source.
// (Abseil's logging library is newer than the Abseil this builds against.)
//
//   TIERD_LOG(INFO) << "serving on " << path;
//   TIERD_VLOG(2) << "copy enqueued";          // shown when SetLogVerbosity(>= 2)
//   TIERD_LOG_FIRST_N(WARNING, 1) << "fallback";  // at most once per call site
//   TIERD_LOG_EVERY_N_SEC(WARNING, 10) << "cut";  // at most once per 10 s per call site
//
// Thread-safe: each line is written with a single write(2).
#ifndef TIERD_COMMON_LOG_H_
#define TIERD_COMMON_LOG_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>

namespace tierd {

enum class LogLevel { kINFO = 0, kWARNING = 1, kERROR = 2 };

// Lines from TIERD_VLOG(n) are emitted when n <= verbosity. Default 0.
void SetLogVerbosity(int verbosity);
int LogVerbosity();

// At most this many bytes of one message are written; the rest is counted.
inline constexpr size_t kMaxLogMessageBytes = 8192;

// One log event: written as one line when destroyed, its message escaped (a newline as \n, other
// control bytes as \xNN) and cut at kMaxLogMessageBytes, so that no string in it can forge a line.
class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line);
  ~LogLine();
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;

  template <typename T>
  LogLine& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  std::string prefix_;  // level, time, source
  std::ostringstream stream_;
};

// Lets one line through per `period` (per call site of TIERD_LOG_EVERY_N_SEC), counting the lines
// held back in between. Thread-safe.
class LogRateLimit {
 public:
  explicit LogRateLimit(double period_seconds);
  // How many lines were held back since the last one let through, when this one may go; -1 when
  // it is held back too.
  int64_t Take();

 private:
  const int64_t period_ns_;
  std::atomic<int64_t> next_ns_{0};  // when the next line may go (absl::GetCurrentTimeNanos)
  std::atomic<int64_t> held_back_{0};
};

// Starts a line a rate-limited call site let through: "(N similar lines left out) " for N > 0.
struct LinesLeftOut {
  int64_t count;
};
std::ostream& operator<<(std::ostream& out, LinesLeftOut left_out);

}  // namespace tierd

#define TIERD_LOG(level) ::tierd::LogLine(::tierd::LogLevel::k##level, __FILE__, __LINE__)
#define TIERD_VLOG(n)                  \
  if (::tierd::LogVerbosity() < (n)) { \
  } else                               \
    TIERD_LOG(INFO)
#define TIERD_LOG_FIRST_N(level, n)                                                        \
  if (static std::atomic<int> tierd_log_count_{0}; tierd_log_count_.fetch_add(1) >= (n)) { \
  } else                                                                                   \
    TIERD_LOG(level)

#define TIERD_LOG_EVERY_N_SEC(level, seconds)                                    \
  if (static ::tierd::LogRateLimit tierd_log_rate_limit_(seconds); false) {      \
  } else if (const int64_t tierd_lines_left_out_ = tierd_log_rate_limit_.Take(); \
             tierd_lines_left_out_ < 0) {                                        \
  } else                                                                         \
    TIERD_LOG(level) << ::tierd::LinesLeftOut { tierd_lines_left_out_ }

#endif  // TIERD_COMMON_LOG_H_
