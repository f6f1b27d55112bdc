#include "server/proto_convert.h"

#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/quote.h"
#include "storage/dtype.h"
#include "storage/model/object_layout.h"

namespace tierd {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // The message travels in the trailing metadata, which clients refuse past 8 KiB by default: a
  // longer one would reach the client as a protocol error instead of this status. Messages quote
  // client strings cut short (common/quote.h); this is the backstop.
  constexpr size_t kMaxMessageBytes = 4096;
  absl::string_view message = status.message();
  std::string text(message.substr(0, kMaxMessageBytes));
  if (message.size() > kMaxMessageBytes) absl::StrAppend(&text, "... (", message.size(), " bytes)");
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::move(text));
}

v1::Grouping ToProto(Grouping grouping) {
  switch (grouping) {
    case Grouping::kTensor:
      return v1::GROUPING_TENSOR;
    case Grouping::kBlock:
      return v1::GROUPING_BLOCK;
    case Grouping::kPhase:
      return v1::GROUPING_PHASE;
  }
  return v1::GROUPING_UNSPECIFIED;
}

absl::StatusOr<Grouping> FromProto(v1::Grouping grouping) {
  switch (grouping) {
    case v1::GROUPING_TENSOR:
      return Grouping::kTensor;
    case v1::GROUPING_UNSPECIFIED:
    case v1::GROUPING_BLOCK:
      return Grouping::kBlock;
    case v1::GROUPING_PHASE:
      return Grouping::kPhase;
    default:
      return absl::InvalidArgumentError(absl::StrCat("grouping: unknown value ", grouping));
  }
}

absl::StatusOr<EvictTier> FromProto(v1::Tier tier) {
  switch (tier) {
    case v1::TIER_UNSPECIFIED:
    case v1::TIER_GPU:
      return EvictTier::kGpu;
    case v1::TIER_HOST:
      return EvictTier::kHost;
    case v1::TIER_ALL:
      return EvictTier::kAll;
    default:
      return absl::InvalidArgumentError(absl::StrCat("tier: unknown value ", tier));
  }
}

void ToProto(const ModelSummary& summary, v1::ModelSummary* out) {
  out->set_name(summary.name);
  out->set_directory(summary.directory);
  out->set_grouping(ToProto(summary.grouping));
  out->set_files(summary.files);
  out->set_objects(summary.objects);
  out->set_tensors(summary.tensors);
  out->set_total_bytes(summary.total_bytes);
  out->set_stale(summary.stale);
  out->set_derived_tensors(static_cast<uint32_t>(summary.derived_tensors));
  out->set_keep_raw(summary.keep_raw);
}

void ToProto(const StagingSlabInfo& slab, v1::Handle* out) {
  out->set_kind(v1::Handle::SLAB);
  out->set_id(slab.id);
  out->set_handle(slab.handle);
  out->set_size(slab.size);
}

void ToProto(const EventInfo& event, v1::Handle* out) {
  out->set_kind(v1::Handle::EVENT);
  out->set_id(event.id);
  out->set_handle(event.handle);
}

void ToProto(const TensorPlacement& tensor, v1::TensorInfo* out) {
  out->set_name(tensor.name);
  out->set_dtype(DTypeName(tensor.dtype));
  for (uint64_t dim : tensor.shape) out->add_shape(dim);
  out->set_offset(tensor.offset);
  out->set_size(tensor.size);
}

absl::StatusOr<std::vector<TensorPlacement>> FromProto(
    const google::protobuf::RepeatedPtrField<v1::TensorInfo>& tensors, uint64_t object_size,
    const char* field) {
  std::vector<TensorPlacement> placements;
  // Names are unique within an object, as within a model's headers: a reader looks tensors up by
  // name.
  absl::flat_hash_set<absl::string_view> names;
  for (int i = 0; i < tensors.size(); ++i) {
    const v1::TensorInfo& tensor = tensors[i];
    auto invalid = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "] (", Quote(tensor.name()), "): ", why));
    };
    if (tensor.name().empty() || tensor.name().size() > 1024) {
      return invalid("a name of 1 to 1024 bytes is needed");
    }
    if (!names.insert(tensor.name()).second) return invalid("the name appears twice");
    std::optional<DType> dtype = ParseDType(tensor.dtype());
    if (!dtype) return invalid(absl::StrCat("unknown dtype ", Quote(tensor.dtype())));
    TensorPlacement placement{tensor.name(), *dtype,
                              std::vector<uint64_t>(tensor.shape().begin(), tensor.shape().end()),
                              tensor.offset(), tensor.size()};
    if (absl::Status placed = CheckPlacement(placement, object_size); !placed.ok()) {
      return invalid(placed.message());
    }
    placements.push_back(std::move(placement));
  }
  return placements;
}

absl::StatusOr<std::vector<DerivedTensorSpec>> FromProto(
    const google::protobuf::RepeatedPtrField<v1::DerivedTensor>& derived) {
  std::vector<DerivedTensorSpec> specs;
  specs.reserve(derived.size());
  for (const v1::DerivedTensor& tensor : derived) {
    DerivedTensorSpec& spec = specs.emplace_back();
    spec.name = tensor.name();
    const std::optional<DType> dtype = ParseDType(tensor.dtype());
    if (!dtype.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("derived tensor ", Quote(tensor.name()),
                                                     ": unknown dtype ", Quote(tensor.dtype())));
    }
    spec.dtype = *dtype;
    spec.shape.assign(tensor.shape().begin(), tensor.shape().end());
    spec.ranges.reserve(tensor.ranges_size());
    for (const v1::TensorRange& range : tensor.ranges()) {
      spec.ranges.push_back(TensorRange{range.tensor(), range.offset(), range.length()});
    }
  }
  return specs;
}

}  // namespace tierd
