#include "storage/model/shard.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/checked_math.h"
#include "common/free_ranges.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "storage/model/object_layout.h"
#include "storage/read_request.h"

namespace tierd {
namespace {

// Decimal digits only (no sign, no spaces), at most 9 of them.
std::optional<uint32_t> ParseSmallNumber(absl::string_view text) {
  if (text.empty() || text.size() > 9) return std::nullopt;
  uint32_t value = 0;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
    value = value * 10 + static_cast<uint32_t>(c - '0');
  }
  return value;
}

// Maps byte ranges of an object to the file ranges that hold them.
class ExtentMap {
 public:
  explicit ExtentMap(const std::vector<Extent>& extents) : by_object_(extents) {
    std::sort(by_object_.begin(), by_object_.end(),
              [](const Extent& a, const Extent& b) { return a.object_offset < b.object_offset; });
  }

  // Appends the file ranges of object bytes [begin, begin + length) to `out`, landing at
  // `target` onwards. False when some of them are in no extent (never, for a tensor's bytes).
  bool Map(uint64_t begin, uint64_t length, uint64_t target, std::vector<Extent>& out) const {
    auto it = std::upper_bound(
        by_object_.begin(), by_object_.end(), begin,
        [](uint64_t offset, const Extent& extent) { return offset < extent.object_offset; });
    if (it == by_object_.begin()) return false;
    --it;
    while (length > 0) {
      if (it == by_object_.end() || begin < it->object_offset ||
          begin >= it->object_offset + it->length) {
        return false;
      }
      const uint64_t skip = begin - it->object_offset;
      const uint64_t take = std::min(length, it->length - skip);
      out.push_back(Extent{it->file, it->file_offset + skip, take, target});
      begin += take;
      target += take;
      length -= take;
      ++it;
    }
    return true;
  }

 private:
  std::vector<Extent> by_object_;
};

// A shard may make the disk read at most this many times its own bytes, or its bytes and this
// allowance, whichever is more: a tensor-parallel rank's rows of a row-major weight (TP of up to
// 64) pass, a one-column slice of a wide tensor (which reads every row's blocks) does not.
constexpr uint64_t kMaxShardReadAmplification = 64;
constexpr uint64_t kShardReadAllowance = 16 << 20;

uint64_t MaxShardRead(uint64_t shard_bytes) {
  return std::max(kMaxShardReadAmplification * shard_bytes, shard_bytes + kShardReadAllowance);
}

// Separate file ranges a shard may take: one per row of the dimensions before `dim` of each split
// tensor. A 128256 × 16384 embedding split along dimension 1 takes 128256; the bound keeps a
// client's spec from costing the daemon gigabytes (a conv weight split along its last dimension).
constexpr uint64_t kMaxShardRanges = 1 << 18;

// A fused tensor may be split as at most this many segments (q, k and v are three).
constexpr size_t kMaxShardSegments = 64;

struct ShardSpec {
  uint32_t dim = 0;
  uint32_t index = 0;
  uint32_t count = 1;
  // Sizes along `dim` of the segments a fused tensor stacks there, each split on its own; empty:
  // the tensor is one segment.
  std::vector<uint32_t> segments;
};

// "DIM:INDEX/COUNT" or "DIM:INDEX/COUNT:S1,S2,..." (decimal, at most 9 digits each) → ShardSpec;
// INVALID_ARGUMENT otherwise.
absl::StatusOr<ShardSpec> ParseShardSpec(absl::string_view text) {
  const size_t colon = text.find(':');
  const size_t slash = text.find('/');
  std::optional<uint32_t> dim, index, count;
  ShardSpec spec;
  bool segments_ok = true;
  if (colon != absl::string_view::npos && slash != absl::string_view::npos && colon < slash) {
    const size_t second = text.find(':', slash);
    dim = ParseSmallNumber(text.substr(0, colon));
    index = ParseSmallNumber(text.substr(colon + 1, slash - colon - 1));
    count = ParseSmallNumber(text.substr(slash + 1, second == absl::string_view::npos
                                                        ? absl::string_view::npos
                                                        : second - slash - 1));
    if (second != absl::string_view::npos) {
      for (absl::string_view segment : absl::StrSplit(text.substr(second + 1), ',')) {
        const std::optional<uint32_t> size = ParseSmallNumber(segment);
        if (!size || spec.segments.size() == kMaxShardSegments) {
          segments_ok = false;
          break;
        }
        spec.segments.push_back(*size);
      }
    }
  }
  if (!dim || !index || !count || !segments_ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard ", Quote(text),
        " is not DIM:INDEX/COUNT (e.g. 0:1/4) or DIM:INDEX/COUNT:SEGMENT,... (e.g. 0:1/4:4096,"
        "1024,1024 for q, k and v stacked along dimension 0; at most ",
        kMaxShardSegments, " segments)"));
  }
  spec.dim = *dim;
  spec.index = *index;
  spec.count = *count;
  return spec;
}

// "DIM:INDEX/COUNT[:S1,S2,...]", the one way a spec is written in a key.
std::string FormatShardSpec(const ShardSpec& spec) {
  std::string text = absl::StrCat(spec.dim, ":", spec.index, "/", spec.count);
  if (!spec.segments.empty()) absl::StrAppend(&text, ":", absl::StrJoin(spec.segments, ","));
  return text;
}

// An object name split at its last '@': ("OBJECT", "DIM:INDEX/COUNT"), or nullopt with no '@'.
std::optional<std::pair<absl::string_view, absl::string_view>> SplitShardName(
    absl::string_view object_name) {
  const size_t at = object_name.rfind('@');
  if (at == absl::string_view::npos) return std::nullopt;
  return std::make_pair(object_name.substr(0, at), object_name.substr(at + 1));
}

absl::Status BadShard(const ObjectInfo& object, const ShardSpec& spec, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("shard ", FormatShardSpec(spec), " of object ", Quote(object.name), ": ", why));
}

// The checks of `spec` against `object` as a whole: a count, an index below it, a dimension some
// tensor has, and no more separate file ranges than kMaxShardRanges.
absl::Status CheckShardSpec(const ObjectInfo& object, const ShardSpec& spec) {
  if (spec.count == 0) return BadShard(object, spec, "the count must be at least 1");
  if (spec.index >= spec.count) return BadShard(object, spec, "the index must be below the count");
  if (spec.segments.size() == 1) {
    return BadShard(object, spec, "one segment is the whole tensor: write the shard without it");
  }
  const bool any_split =
      std::any_of(object.tensors.begin(), object.tensors.end(),
                  [&](const TensorPlacement& tensor) { return tensor.shape.size() > spec.dim; });
  if (!any_split) {
    return BadShard(
        object, spec,
        absl::StrCat("no tensor has dimension ", spec.dim, " (dimensions count from 0)"));
  }
  // One file range per row of the dimensions before `dim` and segment, of each split tensor that
  // has bytes. Counted saturating: a tensor of no bytes may still have huge dimensions
  // ([2^63, 1, 0]), and a count that wrapped would let the loops of ShardTensor run for ever.
  uint64_t ranges = 0;
  for (const TensorPlacement& tensor : object.tensors) {
    if (tensor.shape.size() <= spec.dim || tensor.size == 0) continue;
    uint64_t outer = 1;
    for (size_t d = 0; d < spec.dim; ++d) outer = SaturatingMul(outer, tensor.shape[d]);
    ranges =
        SaturatingAdd(ranges, SaturatingMul(outer, std::max<uint64_t>(spec.segments.size(), 1)));
  }
  if (ranges > kMaxShardRanges) {
    return BadShard(object, spec,
                    absl::StrCat("it would be read as ", ranges, " separate ranges, more than ",
                                 kMaxShardRanges, "; split along a lower dimension"));
  }
  return absl::OkStatus();
}

// One tensor's share of a shard: which of its bytes, in which rows. Each of `outer` rows (of the
// dimensions before the split one, `stride` bytes apart) gives, per segment, object bytes
// [first, first + length) of the row, landing `landing` bytes into the shard's row of
// `row_bytes`.
struct TensorShare {
  struct Piece {
    uint64_t first = 0;
    uint64_t length = 0;
    uint64_t landing = 0;
  };
  std::vector<Piece> row_pieces;
  uint64_t outer = 1;
  uint64_t stride = 0;
  uint64_t row_bytes = 0;
  uint64_t split_rows = 0;  // the shard's rows along the split dimension (of a split tensor)
};

// `tensor`'s share of the shard `spec` names: all of it for a tensor without the split dimension;
// INVALID_ARGUMENT for segments that do not add up or hold fewer rows than the count.
absl::StatusOr<TensorShare> ShareOf(const ObjectInfo& object, const ShardSpec& spec,
                                    const TensorPlacement& tensor) {
  TensorShare share;
  share.row_pieces = {TensorShare::Piece{0, tensor.size, 0}};
  share.row_bytes = tensor.size;
  if (tensor.shape.size() <= spec.dim) return share;
  const uint64_t rows = tensor.shape[spec.dim];
  std::vector<uint64_t> segments(spec.segments.begin(), spec.segments.end());
  if (segments.empty()) segments.push_back(rows);
  uint64_t segment_rows = 0;
  for (uint64_t segment : segments) segment_rows += segment;
  if (segment_rows != rows) {
    return BadShard(
        object, spec,
        absl::StrCat("tensor ", Quote(tensor.name), " has ", rows, " rows in dimension ", spec.dim,
                     "; its segments add up to ", segment_rows));
  }
  // A tensor with bytes has no zero dimension, and its shape's product fits (TensorBytes): these
  // products fit too. One without bytes has no ranges to read, whatever its shape.
  uint64_t inner = DTypeSize(tensor.dtype);  // bytes of one row along `dim`
  for (size_t d = spec.dim + 1; d < tensor.shape.size(); ++d) {
    inner = SaturatingMul(inner, tensor.shape[d]);
  }
  for (size_t d = 0; d < spec.dim; ++d) share.outer = SaturatingMul(share.outer, tensor.shape[d]);
  if (tensor.size == 0) inner = 0;
  share.row_pieces.clear();
  uint64_t segment_start = 0;
  for (uint64_t segment : segments) {
    if (segment < spec.count) {
      return BadShard(
          object, spec,
          absl::StrCat("tensor ", Quote(tensor.name), " has ", segment, " rows in dimension ",
                       spec.dim, spec.segments.empty() ? "" : " in a segment",
                       ", fewer than the count"));
    }
    const auto [first_row, row_count] = ShardRows(segment, spec.index, spec.count);
    share.row_pieces.push_back(TensorShare::Piece{(segment_start + first_row) * inner,
                                                  row_count * inner, share.split_rows * inner});
    segment_start += segment;
    share.split_rows += row_count;
  }
  share.stride = rows * inner;
  share.row_bytes = share.split_rows * inner;
  return share;
}

// Adds `tensor`'s share to `shard`, at `cursor` (aligned) onwards: its placement, its strided
// ranges of the base object, and the file ranges it reads (to `pieces`). Returns the shard's
// cursor past it.
absl::StatusOr<uint64_t> AddTensorShare(const ObjectInfo& object, const ShardSpec& spec,
                                        const ExtentMap& extents, const TensorPlacement& tensor,
                                        uint64_t cursor, ObjectInfo& shard,
                                        std::vector<Extent>& pieces) {
  ASSIGN_OR_RETURN(TensorShare share, ShareOf(object, spec, tensor));
  TensorPlacement out{tensor.name, tensor.dtype, tensor.shape, 0, 0};
  out.offset = RoundUp(cursor, kGatheredTensorAlignment);
  if (tensor.shape.size() > spec.dim) out.shape[spec.dim] = share.split_rows;
  const std::optional<uint64_t> size = CheckedMul(share.outer, share.row_bytes);
  if (tensor.size == 0 || share.row_bytes == 0) {
    share.outer = 0;  // nothing to read, however many rows of nothing there are
  } else if (!size || *size > tensor.size) {
    return absl::InternalError(absl::StrCat("object ", Quote(object.name), ": tensor ",
                                            Quote(tensor.name),
                                            " has a shape its size does not fit"));
  }
  out.size = share.outer == 0 ? 0 : *size;
  for (const TensorShare::Piece& piece : share.row_pieces) {
    if (piece.length == 0) continue;
    shard.from_base.push_back(StridedRange{tensor.offset + piece.first, share.stride,
                                           out.offset + piece.landing, share.row_bytes,
                                           piece.length, share.outer});
  }
  for (uint64_t o = 0; o < share.outer; ++o) {
    for (const TensorShare::Piece& piece : share.row_pieces) {
      if (piece.length == 0) continue;
      if (!extents.Map(tensor.offset + o * share.stride + piece.first, piece.length,
                       out.offset + o * share.row_bytes + piece.landing, pieces)) {
        return absl::InternalError(absl::StrCat("object ", Quote(object.name), ": tensor ",
                                                Quote(tensor.name), " is outside its extents"));
      }
    }
  }
  const uint64_t end = out.offset + out.size;
  shard.tensors.push_back(std::move(out));
  return end;
}

// `pieces` in file order, those back to back in the file and in the object made one.
std::vector<Extent> MergedExtents(std::vector<Extent> pieces) {
  std::sort(pieces.begin(), pieces.end(), [](const Extent& a, const Extent& b) {
    return a.file != b.file ? a.file < b.file : a.file_offset < b.file_offset;
  });
  std::vector<Extent> merged;
  for (const Extent& piece : pieces) {
    if (!merged.empty()) {
      Extent& last = merged.back();
      if (last.file == piece.file && last.file_offset + last.length == piece.file_offset &&
          last.object_offset + last.length == piece.object_offset) {
        last.length += piece.length;
        continue;
      }
    }
    merged.push_back(piece);
  }
  return merged;
}

// What the disk reads for `shard`, against what is asked: a narrow slice along a high dimension
// reads the blocks of every row, most of them other ranks' bytes.
absl::Status CheckShardRead(const ObjectInfo& object, const ShardSpec& spec,
                            const ObjectInfo& shard) {
  std::map<size_t, std::vector<std::pair<uint64_t, uint64_t>>> by_file;
  for (const Extent& extent : shard.extents) {
    by_file[extent.file].emplace_back(extent.file_offset, extent.length);
  }
  uint64_t read = 0;
  for (auto& [file, ranges] : by_file) read += DiskBytesToRead(std::move(ranges));
  if (read > MaxShardRead(shard.size)) {
    return BadShard(object, spec,
                    absl::StrCat("it would read ", read, " bytes from disk for ", shard.size,
                                 " (more than ", kMaxShardReadAmplification,
                                 " times as many); split along a lower dimension, or fetch the "
                                 "whole object"));
  }
  return absl::OkStatus();
}

// The shard of `object` that `spec` names, as an object called `name`; INVALID_ARGUMENT as
// FindShard says.
absl::StatusOr<ObjectInfo> ShardObject(const ObjectInfo& object, const ShardSpec& spec,
                                       std::string name) {
  RETURN_IF_ERROR(CheckShardSpec(object, spec));
  const ExtentMap extents(object.extents);
  ObjectInfo shard;
  shard.name = std::move(name);
  shard.base = object.name;
  std::vector<Extent> pieces;
  uint64_t cursor = 0;
  for (const TensorPlacement& tensor : object.tensors) {
    ASSIGN_OR_RETURN(cursor, AddTensorShare(object, spec, extents, tensor, cursor, shard, pieces));
  }
  shard.size = cursor;
  shard.extents = MergedExtents(std::move(pieces));
  RETURN_IF_ERROR(CheckShardRead(object, spec, shard));
  return shard;
}

// The base object and spec of a shard name; NOT_FOUND / INVALID_ARGUMENT as FindShard.
absl::StatusOr<std::pair<const ObjectInfo*, ShardSpec>> ParseShardName(
    const ModelInfo& model, absl::string_view object_name) {
  const auto split = SplitShardName(object_name);
  const ObjectInfo* base = split ? FindObject(model, split->first) : nullptr;
  if (base == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("model ", Quote(model.name), " has no object ", Quote(object_name)));
  }
  // A suffix with neither ':' nor '/' is no attempt at a spec: the name is just unknown.
  if (split->second.find_first_of(":/") == absl::string_view::npos) {
    return absl::NotFoundError(
        absl::StrCat("model ", Quote(model.name), " has no object ", Quote(object_name)));
  }
  ASSIGN_OR_RETURN(const ShardSpec spec, ParseShardSpec(split->second));
  if (FormatShardSpec(spec) != split->second) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", Quote(split->second), " of object ",
                                                   Quote(base->name), ": write it as ",
                                                   FormatShardSpec(spec)));
  }
  return std::make_pair(base, spec);
}

}  // namespace

std::pair<uint64_t, uint64_t> ShardRows(uint64_t rows, uint32_t index, uint32_t parts) {
  const uint64_t base = rows / parts;
  const uint64_t extra = rows % parts;  // the first `extra` parts have one row more
  const uint64_t first = index * base + std::min<uint64_t>(index, extra);
  return {first, base + (index < extra ? 1 : 0)};
}

absl::StatusOr<ObjectInfo> FindShard(const ModelInfo& model, absl::string_view object_name) {
  ASSIGN_OR_RETURN(const auto parsed, ParseShardName(model, object_name));
  return ShardObject(*parsed.first, parsed.second, std::string(object_name));
}

bool CutShardFromObject(const ObjectInfo& shard, uint64_t object_size, bool object_in_host_memory) {
  if (shard.base.empty()) return false;
  if (object_in_host_memory) return true;
  const bool strided = std::any_of(
      shard.from_base.begin(), shard.from_base.end(),
      [](const StridedRange& range) { return range.rows > 1 && range.width < range.src_pitch; });
  return strided && object_size <= MaxShardRead(shard.size);
}

bool IsShardName(const ModelInfo& model, absl::string_view object_name) {
  return ParseShardName(model, object_name).ok();
}

}  // namespace tierd
