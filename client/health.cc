#include "client/health.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace tierd {

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
  grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  }
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
}

}  // namespace tierd
