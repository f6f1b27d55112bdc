// Byte counts written the way people write them: "4096", "512MiB", "64G", "1.5GiB".
#ifndef TIERD_COMMON_BYTE_SIZE_H_
#define TIERD_COMMON_BYTE_SIZE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tierd {

// Accepts a non-negative number with an optional unit K, M, G, T (each optionally followed by
// "iB" or "B", in any case); units are powers of 1024. Errors: INVALID_ARGUMENT for anything else
// or a value past 2^64.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

// "1.5 GiB", "512 MiB", "4096 B": the largest unit that keeps the number >= 1.
std::string FormatByteSize(uint64_t bytes);

// A byte count usable as an absl flag: --host-cache-bytes=64GiB.
struct ByteSize {
  uint64_t bytes = 0;
};
bool AbslParseFlag(absl::string_view text, ByteSize* size, std::string* error);
std::string AbslUnparseFlag(ByteSize size);

}  // namespace tierd

#endif  // TIERD_COMMON_BYTE_SIZE_H_
