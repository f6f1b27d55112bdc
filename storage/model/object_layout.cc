#include "storage/model/object_layout.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/free_ranges.h"

namespace tierd {
namespace {

RE2::Options QuietOptions() {
  RE2::Options options;
  // A bad pattern is reported to the caller as a Status; RE2 must not also print to stderr.
  options.set_log_errors(false);
  return options;
}

absl::StatusOr<std::unique_ptr<RE2>> Compile(const std::string& pattern, absl::string_view what) {
  auto re = std::make_unique<RE2>(pattern, QuietOptions());
  if (!re->ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", pattern, "' is not a valid RE2 expression: ", re->error()));
  }
  return re;
}

// Debian's RE2 predates its switch to absl::string_view.
re2::StringPiece AsPiece(absl::string_view text) {
  return re2::StringPiece(text.data(), text.size());
}

bool InFileOrder(const SourceTensor& a, const SourceTensor& b) {
  return std::tie(a.file, a.begin, a.end, a.name) < std::tie(b.file, b.begin, b.end, b.name);
}

TensorPlacement PlacementOf(const SourceTensor& tensor, uint64_t offset) {
  return TensorPlacement{tensor.name, tensor.dtype, tensor.shape, offset, tensor.size()};
}

// a + b, or false when it does not fit in 64 bits.
bool AddFits(uint64_t a, uint64_t b, uint64_t* sum) { return !__builtin_add_overflow(a, b, sum); }

absl::Status Invalid(const ObjectInfo& object, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("object '", object.name, "': ", problem));
}

}  // namespace

absl::StatusOr<ObjectGrouper> ObjectGrouper::Create(Grouping grouping, const GroupingRules& rules) {
  ObjectGrouper grouper(grouping);
  if (grouping == Grouping::kTensor) return grouper;
  for (const std::string& pattern : rules.block_patterns) {
    auto re = Compile(pattern, "block pattern");
    if (!re.ok()) return re.status();
    if ((*re)->NumberOfCapturingGroups() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("block pattern '", pattern, "' has ", (*re)->NumberOfCapturingGroups(),
                       " capture groups; it needs exactly one, the block prefix"));
    }
    grouper.block_patterns_.push_back(*std::move(re));
  }
  if (grouping == Grouping::kBlock) return grouper;
  for (const auto& [phase, pattern] : rules.phase_patterns) {
    if (phase.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("phase pattern '", pattern, "' has no name"));
    }
    auto re = Compile(pattern, absl::StrCat("phase '", phase, "' pattern"));
    if (!re.ok()) return re.status();
    grouper.phase_patterns_.emplace_back(phase, *std::move(re));
  }
  return grouper;
}

std::string ObjectGrouper::ObjectNameFor(absl::string_view tensor_name) const {
  if (grouping_ == Grouping::kTensor) return std::string(tensor_name);
  for (const std::unique_ptr<RE2>& block : block_patterns_) {
    re2::StringPiece prefix;
    // An empty capture would make an empty object name, which no key can address: treat it as no
    // match rather than invent a name.
    if (!RE2::PartialMatch(AsPiece(tensor_name), *block, &prefix) || prefix.empty()) continue;
    std::string object(prefix.data(), prefix.size());
    if (grouping_ == Grouping::kBlock) return object;
    // The phase is decided by what follows the block prefix ("attn.q.weight" after "blocks.3.").
    // The capture is normally a prefix of the name, but a custom pattern may capture from the
    // middle; taking the text after the capture covers both.
    const size_t prefix_end =
        static_cast<size_t>(prefix.data() - tensor_name.data()) + prefix.size();
    absl::string_view rest = tensor_name.substr(prefix_end);
    if (!rest.empty() && rest.front() == '.') rest.remove_prefix(1);
    for (const auto& [phase, re] : phase_patterns_) {
      if (RE2::PartialMatch(AsPiece(rest), *re)) return absl::StrCat(object, ".", phase);
    }
    return absl::StrCat(object, ".other");
  }
  return std::string(tensor_name);
}

ObjectInfo LayOutObject(std::string name, std::vector<SourceTensor> tensors) {
  std::sort(tensors.begin(), tensors.end(), InFileOrder);
  ObjectInfo object;
  object.name = std::move(name);
  if (tensors.empty()) return object;

  bool contiguous = tensors[0].pieces.empty();
  for (size_t i = 1; contiguous && i < tensors.size(); ++i) {
    contiguous = tensors[i].pieces.empty() && tensors[i].file == tensors[0].file &&
                 tensors[i].begin == tensors[i - 1].end;
  }

  if (contiguous) {
    // One read of one file range, and the object is byte for byte that range.
    const SourceTensor& first = tensors.front();
    for (const SourceTensor& tensor : tensors) {
      object.tensors.push_back(PlacementOf(tensor, tensor.begin - first.begin));
    }
    object.size = tensors.back().end - first.begin;
    if (object.size > 0) object.extents.push_back(Extent{first.file, first.begin, object.size, 0});
    return object;
  }

  uint64_t cursor = 0;
  std::vector<Extent> extents;
  for (const SourceTensor& tensor : tensors) {
    const uint64_t offset = RoundUp(cursor, kGatheredTensorAlignment);
    object.tensors.push_back(PlacementOf(tensor, offset));
    cursor = offset + tensor.size();
    if (tensor.pieces.empty()) {
      if (tensor.size() > 0)
        extents.push_back(Extent{tensor.file, tensor.begin, tensor.size(), offset});
      continue;
    }
    for (const Extent& piece : tensor.pieces) {
      extents.push_back(
          Extent{piece.file, piece.file_offset, piece.length, offset + piece.object_offset});
    }
  }
  // Extents in file order (ValidateObject's), each run of bytes that is contiguous both in the
  // file and in the object one extent: one read.
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
    return std::tie(a.file, a.file_offset) < std::tie(b.file, b.file_offset);
  });
  for (const Extent& extent : extents) {
    if (!object.extents.empty()) {
      Extent& last = object.extents.back();
      if (last.file == extent.file && last.file_offset + last.length == extent.file_offset &&
          last.object_offset + last.length == extent.object_offset) {
        last.length += extent.length;
        continue;
      }
    }
    object.extents.push_back(extent);
  }
  object.size = cursor;
  return object;
}

std::vector<ObjectInfo> BuildObjects(const ObjectGrouper& grouper,
                                     std::vector<SourceTensor> tensors) {
  std::map<std::string, std::vector<SourceTensor>> groups;
  for (SourceTensor& tensor : tensors) {
    std::string object = grouper.ObjectNameFor(tensor.name);
    groups[std::move(object)].push_back(std::move(tensor));
  }
  std::vector<ObjectInfo> objects;
  objects.reserve(groups.size());
  for (auto& [name, members] : groups) {
    objects.push_back(LayOutObject(name, std::move(members)));
  }
  return objects;
}

absl::Status CheckPlacement(const TensorPlacement& tensor, uint64_t object_size) {
  const std::optional<uint64_t> bytes = TensorBytes(tensor.dtype, tensor.shape);
  if (!bytes) return absl::InvalidArgumentError("shape overflows 64 bits");
  if (*bytes != tensor.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("size ", tensor.size, " does not match dtype and shape (", *bytes, " bytes)"));
  }
  uint64_t end = 0;
  if (!AddFits(tensor.offset, tensor.size, &end) || end > object_size) {
    return absl::InvalidArgumentError(absl::StrCat("bytes [", tensor.offset, ", +", tensor.size,
                                                   ") are outside the object's ", object_size));
  }
  return absl::OkStatus();
}

absl::Status ValidateObject(const ObjectInfo& object, const std::vector<ModelFile>& files) {
  if (object.name.empty()) return Invalid(object, "empty name");
  for (const TensorPlacement& tensor : object.tensors) {
    if (absl::Status placed = CheckPlacement(tensor, object.size); !placed.ok()) {
      return Invalid(object, absl::StrCat("tensor '", tensor.name, "': ", placed.message()));
    }
  }
  std::vector<const Extent*> by_object_offset;
  for (size_t i = 0; i < object.extents.size(); ++i) {
    const Extent& extent = object.extents[i];
    uint64_t file_end = 0;
    uint64_t object_end = 0;
    if (extent.length == 0 || extent.file >= files.size() ||
        !AddFits(extent.file_offset, extent.length, &file_end) ||
        file_end > files[extent.file].size ||
        !AddFits(extent.object_offset, extent.length, &object_end) || object_end > object.size) {
      return Invalid(object, absl::StrCat("extent ", i, " is out of range"));
    }
    if (i > 0) {
      const Extent& previous = object.extents[i - 1];
      if (std::tie(previous.file, previous.file_offset) >=
          std::tie(extent.file, extent.file_offset)) {
        return Invalid(object, "extents are not sorted by file and offset");
      }
    }
    by_object_offset.push_back(&extent);
  }
  // Two extents landing on the same bytes would make the object's contents depend on read order.
  std::sort(by_object_offset.begin(), by_object_offset.end(),
            [](const Extent* a, const Extent* b) { return a->object_offset < b->object_offset; });
  for (size_t i = 1; i < by_object_offset.size(); ++i) {
    const Extent& previous = *by_object_offset[i - 1];
    if (previous.object_offset + previous.length > by_object_offset[i]->object_offset) {
      return Invalid(object, "extents overlap inside the object");
    }
  }
  return absl::OkStatus();
}

}  // namespace tierd
