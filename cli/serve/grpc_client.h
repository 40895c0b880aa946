// The gRPC side of `kvstream bench serve` (docs/benchmarks.md): the same workloads and metric
// definitions as over HTTP, sent as kvstream.v1.Decode/Generate streams, so that one tool measures
// both paths of one daemon side by side. Every request is a coroutine on the caller's io_context
// waiting on a callback-API stream (gRPC's own threads read the messages): no thread per request.
//
// Guarantees:
//  - Generate never throws: a non-OK status (including the deadline) ends in
//    StreamOutcome::error ("grpc CODE"), with the status message in body.
//  - on_message is called once per GenerateResponse, in order, with the steady-clock time at which
//    gRPC handed it over, on a gRPC thread; the coroutine resumes (on the io_context) only after
//    the last call returned.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>  // before awaitable.hpp: Boost 1.74 uses std::exchange without it
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <grpcpp/grpcpp.h>

#include "cli/serve/dataset.h"
#include "cli/serve/sse_client.h"
#include "proto/kvstream.grpc.pb.h"

namespace kvstream::cli::serve {

using MessageFn = std::function<void(const kvstream::v1::GenerateResponse& msg, SteadyTime at)>;

class GrpcClient {
 public:
  GrpcClient(boost::asio::io_context& io, std::shared_ptr<grpc::Channel> channel,
             std::chrono::milliseconds timeout);
  boost::asio::awaitable<StreamOutcome> Generate(kvstream::v1::GenerateRequest req, MessageFn on_message);

 private:
  boost::asio::io_context& io_;
  std::unique_ptr<kvstream::v1::Decode::Stub> stub_;
  std::chrono::milliseconds timeout_;
};

// The Generate request of a conversation's turn, as RequestBody's completions body: the same
// prompt (token ids, or text the daemon encodes), max_tokens, temperature (0: greedy, no
// SamplingParams), ignore_eos and load mode. *prompt_len as RequestBody's.
kvstream::v1::GenerateRequest GenerateRequestFor(const Conversation& c, size_t turn,
                                                 const std::vector<Message>& answers,
                                                 const BodyOptions& o, int* prompt_len);

}  // namespace kvstream::cli::serve
