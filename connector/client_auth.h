// Outgoing gRPC channels that carry the caller's credentials (docs/security.md).
//
// CreateAuthChannel: a channel with `auth.credentials` (TLS, or plaintext when null) on which
// every call sends "authorization: Bearer <auth.bearer_token>" when the token is not empty. The
// token is added by a client interceptor, so it works on plaintext channels too (where gRPC
// refuses CallCredentials) and no call site has to remember it.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

namespace kvstream::connector {

struct ClientAuth {
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // null: plaintext
  std::string bearer_token;                               // empty: none sent
};

std::shared_ptr<grpc::Channel> CreateAuthChannel(const std::string& target, const ClientAuth& auth,
                                                 const grpc::ChannelArguments& args = {});

}  // namespace kvstream::connector
