#include "remote/detail/s3_checksum.h"

#include <openssl/evp.h>

#include <array>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/quote.h"

namespace tierd {
namespace {

constexpr absl::string_view kHeaderPrefix = "x-amz-checksum-";

// A reflected CRC as wide as `Word` (initial value and final xor all ones), a byte at a time: the
// objects checked are single answers, a part at most.
template <typename Word>
class ReflectedCrc {
 public:
  explicit ReflectedCrc(Word polynomial) {
    for (uint32_t i = 0; i < 256; ++i) {
      Word crc = i;
      for (int bit = 0; bit < 8; ++bit) crc = (crc & 1) ? (crc >> 1) ^ polynomial : crc >> 1;
      table_[i] = crc;
    }
  }
  Word operator()(const uint8_t* bytes, uint64_t size) const {
    Word crc = ~Word{0};
    for (uint64_t i = 0; i < size; ++i) crc = table_[(crc ^ bytes[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
  }

 private:
  std::array<Word, 256> table_;
};

template <typename Word>
std::string BigEndianBase64(Word value) {
  std::string bytes(sizeof(Word), '\0');
  for (size_t i = 0; i < sizeof(Word); ++i) {
    bytes[i] = static_cast<char>((value >> (8 * (sizeof(Word) - 1 - i))) & 0xff);
  }
  return absl::Base64Escape(bytes);
}

std::string Digest(const EVP_MD* md, const uint8_t* bytes, uint64_t size) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(bytes, size, digest, &length, md, nullptr) != 1) return "";
  return absl::Base64Escape(absl::string_view(reinterpret_cast<const char*>(digest), length));
}

}  // namespace

std::optional<S3Checksum> ParseS3ChecksumHeader(absl::string_view name, absl::string_view value) {
  if (!absl::ConsumePrefix(&name, kHeaderPrefix)) return std::nullopt;
  if (name != "crc32" && name != "crc32c" && name != "crc64nvme" && name != "sha1" &&
      name != "sha256") {
    return std::nullopt;  // x-amz-checksum-type, -mode, and algorithms to come
  }
  if (value.find('-') != absl::string_view::npos) return std::nullopt;  // composite: "VALUE-N"
  return S3Checksum{std::string(name), std::string(value)};
}

std::string ComputeS3Checksum(absl::string_view algorithm, const uint8_t* bytes, uint64_t size) {
  static const ReflectedCrc<uint32_t> crc32(0xEDB88320u);
  static const ReflectedCrc<uint32_t> crc32c(0x82F63B78u);
  static const ReflectedCrc<uint64_t> crc64nvme(0x9A6C9329AC4BC9B5ull);
  if (algorithm == "crc32") return BigEndianBase64(crc32(bytes, size));
  if (algorithm == "crc32c") return BigEndianBase64(crc32c(bytes, size));
  if (algorithm == "crc64nvme") return BigEndianBase64(crc64nvme(bytes, size));
  if (algorithm == "sha1") return Digest(EVP_sha1(), bytes, size);
  if (algorithm == "sha256") return Digest(EVP_sha256(), bytes, size);
  return "";
}

absl::Status VerifyS3Checksum(const S3Checksum& checksum, const uint8_t* bytes, uint64_t size) {
  const std::string actual = ComputeS3Checksum(checksum.algorithm, bytes, size);
  if (actual.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("an unknown checksum algorithm ", Quote(checksum.algorithm, 32)));
  }
  if (actual != checksum.value) {
    return absl::DataLossError(absl::StrCat("the bytes' ", checksum.algorithm, " is ", actual,
                                            "; the store sent ", Quote(checksum.value, 96)));
  }
  return absl::OkStatus();
}

}  // namespace tierd
