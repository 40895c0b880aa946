#include "connector/client_auth.h"

#include <grpcpp/support/client_interceptor.h>

namespace kvstream::connector {
namespace {

class BearerInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA))
      methods->GetSendInitialMetadata()->emplace("authorization", *header_);
    methods->Proceed();
  }

 private:
  const std::string* header_;
};

class BearerFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerFactory(const std::string& token) : header_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerInterceptor(&header_);
  }

 private:
  const std::string header_;  // lives as long as the channel that owns the factory
};

}  // namespace

std::shared_ptr<grpc::Channel> CreateAuthChannel(const std::string& target, const ClientAuth& auth,
                                                 const grpc::ChannelArguments& args) {
  std::shared_ptr<grpc::ChannelCredentials> creds =
      auth.credentials ? auth.credentials : grpc::InsecureChannelCredentials();
  if (auth.bearer_token.empty()) return grpc::CreateCustomChannel(target, creds, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<BearerFactory>(auth.bearer_token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, creds, args,
                                                                 std::move(factories));
}

}  // namespace kvstream::connector
