#include "storage/model/safetensors_header.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fd_io.h"
#include "common/posix_error.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace tierd {
namespace {

constexpr uint64_t kLengthPrefixBytes = 8;
// A valid header nests three deep ({"name": {"shape": [...]}}) and the SAX handler below refuses
// anything deeper with a precise message; the pre-scan's looser bound is for plainly hostile input.
constexpr int kMaxJsonDepth = 8;
constexpr size_t kMaxRank = 64;
constexpr size_t kMaxTensorNameBytes = 4096;
constexpr char kMetadataKey[] = "__metadata__";
// Marks the refusal of a header over its tensor limit (IsTensorLimit).
constexpr char kTensorLimitPayload[] = "tierd/safetensors-tensor-limit";

uint64_t DecodeLittleEndian64(absl::string_view bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(bytes[i]);
  return value;
}

// nlohmann's parser keeps its own stack today, but bounding depth here, before it sees the text,
// keeps the guarantee independent of how any version of it (or of its DOM) recurses.
absl::Status CheckNestingDepth(absl::string_view label, absl::string_view json) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (const char c : json) {
    if (in_string) {
      in_string = escaped || c != '"';
      escaped = !escaped && c == '\\';
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxJsonDepth) {
        return absl::InvalidArgumentError(
            absl::StrCat(label, ": header JSON nests deeper than ", kMaxJsonDepth, " levels"));
      }
    } else if (c == '}' || c == ']') {
      --depth;  // unbalanced input may go negative; the parser refuses it
    }
  }
  return absl::OkStatus();
}

// Turns nlohmann's SAX events into tensors (offsets still relative to the data) and metadata,
// refusing anything that is not the shape of a safetensors header at the event where it appears.
// SAX rather than a DOM because a DOM silently keeps the last of duplicate keys, and because a
// hostile header is then refused before anything large is built from it.
class HeaderHandler final : public nlohmann::json_sax<nlohmann::json> {
 public:
  HeaderHandler(absl::string_view label, size_t max_tensors)
      : label_(label), max_tensors_(max_tensors) {}

  std::vector<SafetensorsTensor>& tensors() { return tensors_; }
  std::map<std::string, std::string>& metadata() { return metadata_; }
  // Why the parse stopped; OK when it did not.
  const absl::Status& status() const { return status_; }

  bool null() override { return Unexpected("null"); }
  bool boolean(bool) override { return Unexpected("a boolean"); }
  bool number_integer(number_integer_t value) override {
    // nlohmann reports non-negative integers as unsigned; "-0" is the one that arrives here.
    if (value == 0) return number_unsigned(0);
    return Unexpected("a negative number");
  }
  bool number_unsigned(number_unsigned_t value) override {
    if (state_ != State::kArrayElement) return Unexpected("a number");
    const bool shape = field_ == Field::kShape;
    std::vector<uint64_t>& array = shape ? tensor_.shape : offsets_;
    if (array.size() == (shape ? kMaxRank : 2)) {
      return TensorError(shape ? absl::StrCat("\"shape\" has more than ", kMaxRank, " dimensions")
                               : "\"data_offsets\" must be [begin, end]");
    }
    array.push_back(value);
    return true;
  }
  bool number_float(number_float_t, const string_t&) override {
    // Integers beyond 2^64 - 1 arrive here too: nlohmann parses them as floating point.
    return Unexpected("a number with a fraction or exponent, or beyond 2^64 - 1");
  }
  bool string(string_t& value) override {
    if (state_ == State::kMetadataValue) {
      metadata_.emplace(std::move(metadata_key_), std::move(value));
      state_ = State::kMetadataKey;
      return true;
    }
    if (state_ != State::kEntryValue || field_ != Field::kDType) return Unexpected("a string");
    const std::optional<DType> dtype = ParseDType(value);
    if (!dtype.has_value()) return TensorError(absl::StrCat("dtype ", Quote(value), " is unknown"));
    tensor_.dtype = *dtype;
    state_ = State::kEntryKey;
    return true;
  }
  bool binary(binary_t&) override { return Unexpected("binary data"); }  // never from JSON text

  bool start_object(std::size_t) override {
    if (state_ == State::kRoot) {
      state_ = State::kTopKey;
    } else if (state_ == State::kTopValue && in_metadata_) {
      state_ = State::kMetadataKey;
    } else if (state_ == State::kTopValue) {
      tensor_.shape.clear();
      offsets_.clear();
      seen_fields_ = 0;
      state_ = State::kEntryKey;
    } else {
      return Unexpected("an object");
    }
    return true;
  }
  bool key(string_t& key) override {
    if (state_ == State::kTopKey) {
      in_metadata_ = key == kMetadataKey;
      if (!in_metadata_ && key.empty()) return Error("a tensor has an empty name");
      if (!in_metadata_ && ++tensors_seen_ > max_tensors_) {
        status_ = absl::InvalidArgumentError(
            absl::StrCat(label_, ": more than ", max_tensors_, " tensors"));
        status_.SetPayload(kTensorLimitPayload, absl::Cord());
        return false;
      }
      if (!in_metadata_ && key.size() > kMaxTensorNameBytes) {
        return Error(absl::StrCat("tensor name ", Quote(key), " is longer than ",
                                  kMaxTensorNameBytes, " bytes"));
      }
      if (!names_.insert(key).second) {
        return Error(absl::StrCat(in_metadata_ ? "" : "tensor ", Quote(key), " appears twice"));
      }
      tensor_.name = std::move(key);
      state_ = State::kTopValue;
    } else if (state_ == State::kMetadataKey) {
      if (metadata_.count(key) != 0) {
        return Error(absl::StrCat("metadata key ", Quote(key), " appears twice"));
      }
      metadata_key_ = std::move(key);
      state_ = State::kMetadataValue;
    } else if (state_ == State::kEntryKey) {
      const auto* const known = std::find(std::begin(kFieldNames), std::end(kFieldNames), key);
      if (known == std::end(kFieldNames)) {
        return TensorError(absl::StrCat("unknown key ", Quote(key)));
      }
      field_ = static_cast<Field>(known - std::begin(kFieldNames));
      const unsigned bit = 1u << static_cast<int>(field_);
      if ((seen_fields_ & bit) != 0) return TensorError(absl::StrCat(Quote(key), " appears twice"));
      seen_fields_ |= bit;
      state_ = State::kEntryValue;
    } else {
      return Unexpected("a key");  // unreachable: nlohmann only reports keys inside objects
    }
    return true;
  }
  bool end_object() override {
    if (state_ == State::kTopKey) {
      state_ = State::kDone;
    } else if (state_ == State::kMetadataKey) {
      state_ = State::kTopKey;
    } else if (state_ == State::kEntryKey) {
      for (const Field field : {Field::kDType, Field::kShape, Field::kDataOffsets}) {
        if ((seen_fields_ & (1u << static_cast<int>(field))) == 0) {
          return TensorError(absl::StrCat("\"", FieldName(field), "\" is missing"));
        }
      }
      tensor_.begin = offsets_[0];
      tensor_.end = offsets_[1];
      tensors_.push_back(std::move(tensor_));
      state_ = State::kTopKey;
    } else {
      return Unexpected("the end of an object");  // unreachable for well-formed JSON
    }
    return true;
  }
  bool start_array(std::size_t) override {
    if (state_ != State::kEntryValue || field_ == Field::kDType) return Unexpected("an array");
    state_ = State::kArrayElement;
    return true;
  }
  bool end_array() override {
    if (state_ != State::kArrayElement) return Unexpected("the end of an array");  // unreachable
    if (field_ == Field::kDataOffsets && offsets_.size() != 2) {
      return TensorError("\"data_offsets\" must be [begin, end]");
    }
    state_ = State::kEntryKey;
    return true;
  }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::json::exception& error) override {
    return Error(
        absl::StrCat("header is not valid JSON (byte ", position, "): ", Quote(error.what())));
  }

 private:
  // What the next event may be.
  enum class State {
    kRoot,           // the top-level object
    kTopKey,         // a tensor name, "__metadata__", or the end of the top-level object
    kTopValue,       // the object after a top-level key
    kMetadataKey,    // a metadata key or the end of the metadata
    kMetadataValue,  // a metadata string
    kEntryKey,       // a key of a tensor entry, or its end
    kEntryValue,     // the value of `field_`
    kArrayElement,   // an integer of `field_`, or the end of its array
    kDone,
  };
  enum class Field { kDType, kShape, kDataOffsets };

  static constexpr const char* kFieldNames[] = {"dtype", "shape", "data_offsets"};
  static const char* FieldName(Field field) { return kFieldNames[static_cast<int>(field)]; }

  bool Error(absl::string_view message) {
    status_ = absl::InvalidArgumentError(absl::StrCat(label_, ": ", message));
    return false;
  }
  bool TensorError(absl::string_view message) {
    return Error(absl::StrCat("tensor ", Quote(tensor_.name), ": ", message));
  }
  // Refuses `found` where the state wants something else, saying what was wanted.
  bool Unexpected(absl::string_view found) {
    const std::string field = absl::StrCat("\"", FieldName(field_), "\"");
    switch (state_) {
      case State::kRoot:
        return Error(absl::StrCat("header must be a JSON object, not ", found));
      case State::kTopValue:
        return in_metadata_ ? Error(absl::StrCat("\"__metadata__\" must be an object, not ", found))
                            : TensorError(absl::StrCat("entry must be an object, not ", found));
      case State::kMetadataValue:
        return Error(
            absl::StrCat("metadata ", Quote(metadata_key_), " must be a string, not ", found));
      case State::kEntryValue:
        return TensorError(
            absl::StrCat(field, " must be ",
                         field_ == Field::kDType ? "a string" : "an array of non-negative integers",
                         ", not ", found));
      case State::kArrayElement:
        return TensorError(absl::StrCat(field, " must hold non-negative integers, not ", found));
      default:
        return Error(absl::StrCat("unexpected ", found, " in header"));
    }
  }

  const absl::string_view label_;
  const size_t max_tensors_;
  size_t tensors_seen_ = 0;
  absl::Status status_;
  State state_ = State::kRoot;
  std::set<std::string> names_;  // top-level keys seen, "__metadata__" included
  bool in_metadata_ = false;
  std::string metadata_key_;
  SafetensorsTensor tensor_;  // the entry being read
  Field field_ = Field::kDType;
  unsigned seen_fields_ = 0;  // bit per Field
  std::vector<uint64_t> offsets_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Checks one tensor's numbers and makes its offsets absolute. The element count is checked over
// the non-zero dimensions, so any product of dimensions a consumer takes (strides) fits 64 bits.
absl::Status PlaceTensor(absl::string_view label, uint64_t data_start, uint64_t file_size,
                         SafetensorsTensor& tensor) {
  const auto error = [&](absl::StatusCode code, absl::string_view message) {
    return absl::Status(code, absl::StrCat(label, ": tensor ", Quote(tensor.name), ": ", message));
  };
  const auto offsets = [&] {
    return absl::StrCat("data_offsets [", tensor.begin, ", ", tensor.end, "]");
  };
  const auto shape = [&] {
    return absl::StrCat("shape [", absl::StrJoin(tensor.shape, ", "), "] of ",
                        DTypeName(tensor.dtype));
  };
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  if (tensor.begin > tensor.end) {
    return error(absl::StatusCode::kInvalidArgument,
                 absl::StrCat(offsets(), " end before they begin"));
  }
  if (tensor.end > kMax - data_start) {
    return error(absl::StatusCode::kInvalidArgument, absl::StrCat(offsets(), " overflow 64 bits"));
  }
  const std::optional<uint64_t> needed = TensorBytes(tensor.dtype, tensor.shape);
  if (!needed) {
    return error(absl::StatusCode::kInvalidArgument, absl::StrCat(shape(), " overflows 64 bits"));
  }
  const uint64_t bytes = *needed;
  if (bytes != tensor.end - tensor.begin) {
    return error(absl::StatusCode::kInvalidArgument,
                 absl::StrCat(shape(), " needs ", bytes, " bytes but ", offsets(), " hold ",
                              tensor.end - tensor.begin));
  }
  if (tensor.end > file_size - data_start) {
    return error(absl::StatusCode::kDataLoss,
                 absl::StrCat(offsets(), " run past the end of the file (", file_size - data_start,
                              " bytes of data): truncated"));
  }
  tensor.begin += data_start;
  tensor.end += data_start;
  return absl::OkStatus();
}

// REQUIRES: `tensors` sorted by begin.
absl::Status CheckNoOverlap(absl::string_view label,
                            const std::vector<SafetensorsTensor>& tensors) {
  const SafetensorsTensor* furthest = nullptr;  // the non-empty tensor that ends last so far
  for (const SafetensorsTensor& tensor : tensors) {
    if (tensor.size() == 0) continue;  // owns no bytes, so overlaps nothing
    if (furthest != nullptr && tensor.begin < furthest->end) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": tensors ", Quote(furthest->name), " [", furthest->begin, ", ", furthest->end,
          ") and ", Quote(tensor.name), " [", tensor.begin, ", ", tensor.end, ") overlap"));
    }
    if (furthest == nullptr || tensor.end > furthest->end) furthest = &tensor;
  }
  return absl::OkStatus();
}

// Reads exactly `length` bytes at `offset`, retrying EINTR and short reads.
absl::Status ReadFully(int fd, const std::string& path, uint64_t offset, char* buffer,
                       uint64_t length) {
  while (length > 0) {
    const ssize_t n = pread(fd, buffer, length, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return PosixError(absl::StrCat("reading ", path), errno);
    if (n == 0) return absl::DataLossError(absl::StrCat(path, ": file shrank while being read"));
    buffer += n;
    offset += static_cast<uint64_t>(n);
    length -= static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view file_label,
                                                         absl::string_view file_start,
                                                         uint64_t file_size, size_t max_tensors) {
  if (file_size < kLengthPrefixBytes) {
    return absl::DataLossError(absl::StrCat(file_label, ": file is ", file_size,
                                            " bytes, too short for the header length: truncated"));
  }
  if (file_start.size() < kLengthPrefixBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_label, ": caller passed ", file_start.size(), " bytes, not the first 8"));
  }
  const uint64_t header_length = DecodeLittleEndian64(file_start);
  if (header_length > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(file_label, ": header length ", header_length,
                                                   " is over the limit of ",
                                                   kMaxSafetensorsHeaderBytes, " bytes"));
  }
  SafetensorsHeader header;
  header.data_start = kLengthPrefixBytes + header_length;  // no overflow: the length is bounded
  if (header.data_start > file_size) {
    return absl::DataLossError(absl::StrCat(file_label, ": header of ", header_length,
                                            " bytes runs past the end of the ", file_size,
                                            "-byte file: truncated"));
  }
  if (file_start.size() < header.data_start) {
    return absl::InvalidArgumentError(absl::StrCat(file_label, ": caller passed ",
                                                   file_start.size(), " bytes, not the first ",
                                                   header.data_start));
  }
  const absl::string_view json = file_start.substr(kLengthPrefixBytes, header_length);
  RETURN_IF_ERROR(CheckNestingDepth(file_label, json));

  HeaderHandler handler(file_label, max_tensors);
  bool parsed = false;
  try {
    parsed = nlohmann::json::sax_parse(json.begin(), json.end(), &handler);
  } catch (const nlohmann::json::exception& e) {  // errors go to parse_error; this is a backstop
    return absl::InvalidArgumentError(
        absl::StrCat(file_label, ": header is not valid JSON: ", Quote(e.what())));
  }
  if (!parsed) {
    if (!handler.status().ok()) return handler.status();
    return absl::InvalidArgumentError(absl::StrCat(file_label, ": header is not valid JSON"));
  }

  header.tensors = std::move(handler.tensors());
  header.metadata = std::move(handler.metadata());
  for (SafetensorsTensor& tensor : header.tensors) {
    RETURN_IF_ERROR(PlaceTensor(file_label, header.data_start, file_size, tensor));
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
              return std::tie(a.begin, a.name) < std::tie(b.begin, b.name);
            });
  RETURN_IF_ERROR(CheckNoOverlap(file_label, header.tensors));
  return header;
}

bool IsTensorLimit(const absl::Status& status) {
  return status.GetPayload(kTensorLimitPayload).has_value();
}

absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path) {
  int fd;
  do {
    fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return PosixError(absl::StrCat("opening ", path), errno);
  ScopedFd closer(fd);
  return ReadSafetensorsHeader(fd, path);
}

absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(int fd, const std::string& path,
                                                        size_t max_tensors) {
  struct stat st;
  if (fstat(fd, &st) != 0) return PosixError(absl::StrCat("stat ", path), errno);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);

  std::string bytes(std::min(file_size, kLengthPrefixBytes), '\0');
  RETURN_IF_ERROR(ReadFully(fd, path, 0, bytes.data(), bytes.size()));
  // Read the header only when its length is plausible; otherwise the parser refuses the file from
  // the first 8 bytes alone, and a hostile length prefix costs no read.
  if (bytes.size() == kLengthPrefixBytes) {
    const uint64_t header_length = DecodeLittleEndian64(bytes);
    if (header_length <= kMaxSafetensorsHeaderBytes &&
        kLengthPrefixBytes + header_length <= file_size) {
      bytes.resize(kLengthPrefixBytes + header_length);
      RETURN_IF_ERROR(ReadFully(fd, path, kLengthPrefixBytes, bytes.data() + kLengthPrefixBytes,
                                header_length));
    }
  }
  return ParseSafetensorsHeader(path, bytes, file_size, max_tensors);
}

}  // namespace tierd
