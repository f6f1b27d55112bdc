#include "storage/model/derived_tensors.h"

#include <algorithm>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/quote.h"
#include "common/status_macros.h"

namespace tierd {
namespace {

absl::Status Invalid(const DerivedTensorSpec& spec, absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat("derived tensor ", Quote(spec.name), ": ", problem));
}

constexpr size_t kMaxDerivedNameBytes = 4096;
constexpr size_t kMaxDerivedRank = 64;

// One range of a spec, resolved to the file.
struct Piece {
  size_t spec = 0;
  Extent extent;  // object_offset counted from the derived tensor's first byte
};

using TensorIndex = absl::flat_hash_map<absl::string_view, size_t>;

// The bounds of one spec's own: a name, a rank, a shape whose bytes fit 64 bits, and ranges within
// a spec's and (counted in `ranges_in_all`) a model's bound. Returns the bytes its shape takes.
absl::StatusOr<uint64_t> CheckSpec(const DerivedTensorSpec& spec, size_t& ranges_in_all) {
  if (spec.name.empty()) return Invalid(spec, "it has no name");
  // The bounds a checkpoint's own tensors are held to (storage/model/safetensors_header.cc).
  if (spec.name.size() > kMaxDerivedNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a derived tensor's name is longer than ", kMaxDerivedNameBytes, " bytes"));
  }
  if (spec.shape.size() > kMaxDerivedRank) {
    return Invalid(spec, absl::StrCat("its shape has more than ", kMaxDerivedRank, " dimensions"));
  }
  const std::optional<uint64_t> bytes = TensorBytes(spec.dtype, spec.shape);
  if (!bytes) return Invalid(spec, "its shape overflows 64 bits");
  ranges_in_all += spec.ranges.size();
  if (spec.ranges.size() > kMaxRangesPerDerivedTensor ||
      ranges_in_all > kMaxDerivedRangesPerModel) {
    return Invalid(
        spec, absl::StrCat("more ranges than a derived tensor (", kMaxRangesPerDerivedTensor,
                           ") or a model (", kMaxDerivedRangesPerModel, ") may be gathered from"));
  }
  return *bytes;
}

// Spec `s`'s ranges resolved to pieces of the checkpoint's files, appended to `pieces` (ranges
// back to back in a file and in the tensor made one); the tensors they take are added to
// `consumed`.
absl::Status ResolveRanges(size_t s, const DerivedTensorSpec& spec, uint64_t bytes,
                           const std::vector<SourceTensor>& tensors, const TensorIndex& by_name,
                           std::vector<Piece>& pieces, absl::flat_hash_set<size_t>& consumed) {
  const size_t first_piece = pieces.size();
  uint64_t cursor = 0;
  for (const TensorRange& range : spec.ranges) {
    auto source = by_name.find(range.tensor);
    if (source == by_name.end()) {
      return Invalid(spec, absl::StrCat(Quote(range.tensor), " is not a tensor of the checkpoint"));
    }
    const SourceTensor& tensor = tensors[source->second];
    if (tensor.dtype != spec.dtype) {
      return Invalid(spec, absl::StrCat("it is ", DTypeName(spec.dtype), " but ",
                                        Quote(range.tensor), " is ", DTypeName(tensor.dtype),
                                        ": a conversion that changes the dtype changes values"));
    }
    if (range.length == 0 && range.offset == 0 && tensor.size() == 0) {
      consumed.insert(source->second);  // a zero-size tensor taken: nothing to read
      continue;
    }
    if (range.length == 0 || range.offset > tensor.size() ||
        range.length > tensor.size() - range.offset) {
      return Invalid(spec, absl::StrCat("bytes [", range.offset, ", +", range.length, ") of ",
                                        Quote(range.tensor), " are empty or past its ",
                                        tensor.size(), " bytes"));
    }
    if (range.length > bytes - cursor) {
      return Invalid(spec, absl::StrCat("its ranges hold more than the ", bytes, " bytes ",
                                        DTypeName(spec.dtype), " of its shape takes"));
    }
    const Extent extent{tensor.file, tensor.begin + range.offset, range.length, cursor};
    consumed.insert(source->second);
    cursor += range.length;
    if (pieces.size() > first_piece) {
      Extent& last = pieces.back().extent;
      if (last.file == extent.file && last.file_offset + last.length == extent.file_offset) {
        last.length += extent.length;
        continue;
      }
    }
    pieces.push_back(Piece{s, extent});
  }
  if (cursor != bytes) {
    return Invalid(spec, absl::StrCat("its ranges hold ", cursor, " bytes; ", DTypeName(spec.dtype),
                                      " of its shape takes ", bytes));
  }
  return absl::OkStatus();
}

// No byte of the checkpoint goes to two places: the object layouts assume each file range is read
// into one place.
absl::Status CheckNoByteGoesTwice(const std::vector<DerivedTensorSpec>& specs,
                                  const std::vector<Piece>& pieces) {
  std::vector<const Piece*> in_file_order;
  in_file_order.reserve(pieces.size());
  for (const Piece& piece : pieces) in_file_order.push_back(&piece);
  std::sort(in_file_order.begin(), in_file_order.end(), [](const Piece* a, const Piece* b) {
    return std::tie(a->extent.file, a->extent.file_offset) <
           std::tie(b->extent.file, b->extent.file_offset);
  });
  for (size_t i = 1; i < in_file_order.size(); ++i) {
    const Extent& previous = in_file_order[i - 1]->extent;
    const Extent& next = in_file_order[i]->extent;
    if (previous.file == next.file && previous.file_offset + previous.length > next.file_offset) {
      return Invalid(
          specs[in_file_order[i]->spec],
          absl::StrCat("its bytes overlap those of ", Quote(specs[in_file_order[i - 1]->spec].name),
                       " (or its own): a checkpoint byte goes to one place"));
    }
  }
  return absl::OkStatus();
}

// Each derived tensor's name is free: no tensor left of the checkpoint, nor another derived one,
// has it.
absl::Status CheckNamesAreFree(const std::vector<DerivedTensorSpec>& specs,
                               const std::vector<SourceTensor>& tensors,
                               const absl::flat_hash_set<size_t>& consumed) {
  absl::flat_hash_set<absl::string_view> names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!consumed.contains(i)) names.insert(tensors[i].name);
  }
  for (const DerivedTensorSpec& spec : specs) {
    if (!names.insert(spec.name).second) {
      return Invalid(spec,
                     "its name is taken by a tensor of the checkpoint or another derived tensor");
    }
  }
  return absl::OkStatus();
}

// Spec `s`'s tensor from its pieces: one file range is a plain tensor under a new name.
SourceTensor DerivedTensor(const DerivedTensorSpec& spec, std::vector<Extent> pieces) {
  SourceTensor derived{spec.name, spec.dtype, spec.shape, 0, 0, 0, std::move(pieces)};
  if (derived.pieces.empty()) return derived;
  const Extent& first = derived.pieces.front();
  derived.file = first.file;
  derived.begin = first.file_offset;
  derived.end = first.file_offset + first.length;
  if (derived.pieces.size() == 1) derived.pieces.clear();
  return derived;
}

}  // namespace

absl::Status ApplyDerivedTensors(const std::vector<DerivedTensorSpec>& specs,
                                 std::vector<SourceTensor>& tensors) {
  if (specs.empty()) return absl::OkStatus();
  TensorIndex by_name;
  by_name.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) by_name.emplace(tensors[i].name, i);

  std::vector<Piece> pieces;
  absl::flat_hash_set<size_t> consumed;
  size_t ranges_in_all = 0;
  for (size_t s = 0; s < specs.size(); ++s) {
    ASSIGN_OR_RETURN(const uint64_t bytes, CheckSpec(specs[s], ranges_in_all));
    RETURN_IF_ERROR(ResolveRanges(s, specs[s], bytes, tensors, by_name, pieces, consumed));
  }
  RETURN_IF_ERROR(CheckNoByteGoesTwice(specs, pieces));
  RETURN_IF_ERROR(CheckNamesAreFree(specs, tensors, consumed));

  std::vector<SourceTensor> result;
  result.reserve(tensors.size() - consumed.size() + specs.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!consumed.contains(i)) result.push_back(std::move(tensors[i]));
  }
  size_t next_piece = 0;
  for (size_t s = 0; s < specs.size(); ++s) {
    std::vector<Extent> extents;
    for (; next_piece < pieces.size() && pieces[next_piece].spec == s; ++next_piece) {
      extents.push_back(pieces[next_piece].extent);
    }
    result.push_back(DerivedTensor(specs[s], std::move(extents)));
  }
  tensors = std::move(result);
  return absl::OkStatus();
}

}  // namespace tierd
