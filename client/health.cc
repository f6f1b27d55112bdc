#include "client/health.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace tierd {

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

std::string UnixTarget(const std::string& socket_path) {
  return absl::StrCat("unix:", socket_path);
}

absl::StatusOr<std::string> CheckHealth(const std::string& socket_path, absl::Duration timeout) {
  auto channel = grpc::CreateChannel(UnixTarget(socket_path), grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  if (absl::Status status = FromGrpcStatus(stub->Check(&context, request, &response));
      !status.ok()) {
    return status;
  }
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
}

}  // namespace tierd
