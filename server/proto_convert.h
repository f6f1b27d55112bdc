// Conversions between the tierd.v1 messages and the daemon's own types, and the one place where an
// absl::Status becomes a grpc::Status.
#ifndef TIERD_SERVER_PROTO_CONVERT_H_
#define TIERD_SERVER_PROTO_CONVERT_H_

#include <grpcpp/support/status.h>

#include <vector>

#include "absl/status/statusor.h"
#include "gpu/gpu_tier.h"
#include "storage/model/catalog.h"
#include "tierd/v1/tierd.pb.h"

namespace tierd {

grpc::Status ToGrpcStatus(const absl::Status& status);

v1::Grouping ToProto(Grouping grouping);
// GROUPING_UNSPECIFIED means block.
absl::StatusOr<Grouping> FromProto(v1::Grouping grouping);
absl::StatusOr<EvictTier> FromProto(v1::Tier tier);

void ToProto(const ModelSummary& summary, v1::ModelSummary* out);
void ToProto(const TensorPlacement& tensor, v1::TensorInfo* out);
void ToProto(const StagingSlabInfo& slab, v1::Handle* out);
void ToProto(const EventInfo& event, v1::Handle* out);
// Checks a client's tensor index for an object of `object_size` bytes: known dtypes, sizes that
// match dtype × shape, every tensor inside the object. INVALID_ARGUMENT names `field` and the
// tensor.
absl::StatusOr<std::vector<TensorPlacement>> FromProto(
    const google::protobuf::RepeatedPtrField<v1::TensorInfo>& tensors, uint64_t object_size,
    const char* field);
// A registration's derived tensors (RegisterModelRequest.derived). INVALID_ARGUMENT for an unknown
// dtype, naming the tensor; the rest is checked against the checkpoint (ApplyDerivedTensors).
absl::StatusOr<std::vector<DerivedTensorSpec>> FromProto(
    const google::protobuf::RepeatedPtrField<v1::DerivedTensor>& derived);

}  // namespace tierd

#endif  // TIERD_SERVER_PROTO_CONVERT_H_
