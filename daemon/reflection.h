// gRPC server reflection (grpc.reflection.v1alpha, what grpcurl and grpc_cli use) on a daemon's
// gRPC port, behind the daemon's authentication.
//
// Guarantees:
//  - Every stream is checked first with Authorizer::Check(Method::kReflection): with credentials
//    configured, a caller without a client or peer credential gets UNAUTHENTICATED and learns
//    nothing, not even the service list (docs/security.md). Without credentials (loopback) it
//    is open, like every method there.
//  - list_services names the services given at construction, grpc.health.v1.Health and this one.
//  - File requests answer from the protobuf descriptors linked into the binary: the file asked
//    for and every file it imports, transitively; an unknown name is an error_response NOT_FOUND
//    on the stream (the stream goes on).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "daemon/credentials.h"
#include "proto/reflection.grpc.pb.h"

namespace kvstream::daemon {

class ReflectionService final : public grpc::reflection::v1alpha::ServerReflection::Service {
 public:
  ReflectionService(std::vector<std::string> services, std::shared_ptr<const Authorizer> authz);

  grpc::Status ServerReflectionInfo(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<grpc::reflection::v1alpha::ServerReflectionResponse,
                               grpc::reflection::v1alpha::ServerReflectionRequest>* stream) override;

  // One request's answer (without the stream and the check), for tests.
  grpc::reflection::v1alpha::ServerReflectionResponse Answer(
      const grpc::reflection::v1alpha::ServerReflectionRequest& request) const;

 private:
  std::vector<std::string> services_;
  std::shared_ptr<const Authorizer> authz_;
};

}  // namespace kvstream::daemon
