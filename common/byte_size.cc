#include "common/byte_size.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace tierd {
namespace {

constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};

}  // namespace

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  absl::string_view rest = absl::StripAsciiWhitespace(text);
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("bad byte size '", text, "': expected e.g. 4096, 512MiB or 64G"));
  };
  size_t digits = 0;
  while (digits < rest.size() && (absl::ascii_isdigit(rest[digits]) || rest[digits] == '.')) {
    ++digits;
  }
  absl::string_view number = rest.substr(0, digits);
  absl::string_view unit = absl::StripAsciiWhitespace(rest.substr(digits));
  if (number.empty()) return bad();
  int shift = 0;
  if (!unit.empty()) {
    switch (absl::ascii_toupper(unit[0])) {
      case 'B':
        shift = 0;
        break;
      case 'K':
        shift = 10;
        break;
      case 'M':
        shift = 20;
        break;
      case 'G':
        shift = 30;
        break;
      case 'T':
        shift = 40;
        break;
      default:
        return bad();
    }
    const std::string suffix = absl::AsciiStrToLower(unit.substr(1));
    if (shift != 0 && !(suffix.empty() || suffix == "b" || suffix == "ib")) return bad();
    if (shift == 0 && !suffix.empty()) return bad();
  }
  if (number.find('.') == absl::string_view::npos) {
    uint64_t value = 0;
    if (!absl::SimpleAtoi(number, &value)) return bad();
    if (shift > 0 && value > (UINT64_MAX >> shift)) return bad();
    return value << shift;
  }
  double value = 0;
  if (!absl::SimpleAtod(number, &value) || !(value >= 0)) return bad();
  const double bytes = std::ldexp(value, shift);
  if (bytes >= 18446744073709551616.0) return bad();
  return static_cast<uint64_t>(bytes);
}

std::string FormatByteSize(uint64_t bytes) {
  int unit = 0;
  double value = static_cast<double>(bytes);
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  if (unit == 0) return absl::StrCat(bytes, " B");
  // Past 9999 of the largest unit, %g would switch to an exponent.
  if (value >= 10000) return absl::StrFormat("%.0f %s", value, kUnits[unit]);
  return absl::StrFormat("%.4g %s", value, kUnits[unit]);
}

bool AbslParseFlag(absl::string_view text, ByteSize* size, std::string* error) {
  absl::StatusOr<uint64_t> parsed = ParseByteSize(text);
  if (!parsed.ok()) {
    *error = std::string(parsed.status().message());
    return false;
  }
  size->bytes = *parsed;
  return true;
}

std::string AbslUnparseFlag(ByteSize size) { return absl::StrCat(size.bytes); }

}  // namespace tierd
