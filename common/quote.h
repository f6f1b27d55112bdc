// Client-supplied strings in logs and error messages. A name, key or path a client sent may hold a
// newline (which would forge a log line), NUL bytes, or a megabyte (which would flood the log and
// make an error too large for gRPC's metadata). Every such string is written through Quote: escaped
// onto one line and cut short.
#ifndef TIERD_COMMON_QUOTE_H_
#define TIERD_COMMON_QUOTE_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace tierd {

// At most this many bytes of a quoted string are shown.
inline constexpr size_t kMaxQuotedBytes = 256;

// `text` in double quotes, C-escaped (\n, \0, \", \\, \xNN for other bytes that are not printable
// ASCII), so it stays on one line; when longer than `max_bytes` only its first `max_bytes` are
// shown, followed by `...` and its length: "abc"... (1048576 bytes).
std::string Quote(absl::string_view text, size_t max_bytes = kMaxQuotedBytes);

}  // namespace tierd

#endif  // TIERD_COMMON_QUOTE_H_
