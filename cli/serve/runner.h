// The load of `kvstream bench serve`: conversations arrive as a Poisson process (gamma with
// --burstiness, vLLM's get_request: inter-arrival gaps drawn from the seed, then scaled so that
// the last arrival falls at N / rate) or all at once (rate infinity); a conversation's turns run
// one after the other, conversations concurrently; at most max_concurrency requests are in
// flight (a request that arrives past it waits for a slot, as under vLLM's semaphore). Every
// request is a coroutine on one io_context thread.
#pragma once

#include <string>
#include <vector>

#include "cli/serve/dataset.h"
#include "cli/serve/metrics.h"
#include "cli/serve/sse_client.h"

namespace kvstream::v1 {
class GenerateResponse;
}

namespace kvstream::cli::serve {

class GrpcClient;

// Where the requests go: an OpenAI-compatible server over HTTP, or a decode daemon's gRPC
// Generate (exactly one set).
struct Target {
  SseClient* http = nullptr;
  GrpcClient* grpc = nullptr;
};

struct LoadOptions {
  double request_rate = 0;  // conversations per second; infinity: all at once
  double burstiness = 1;
  int max_concurrency = 0;  // 0: unbounded
  uint64_t seed = 0;
  std::string path = "/v1/completions";
  BodyOptions body;
  bool progress = false;    // a progress bar on stderr
  std::string label;        // shown in the progress bar
};

struct LoadResult {
  std::vector<RequestRecord> records;  // conversation-major, turns in order
  double duration_s = 0;               // the run's start to its last answer
};

// Runs every turn of `conversations` against `target` (on `io`, which must not be running).
LoadResult RunLoad(boost::asio::io_context& io, Target target,
                   const std::vector<Conversation>& conversations, const LoadOptions& o);

// Parses one streamed event into `r` / `answer` (exposed for tests): a chunk with a non-empty
// "choices" is a token event at `at_s` (seconds since the request's start); its text
// (completions: choices[0].text, chat: choices[0].delta.content) and token_ids are appended;
// "usage" sets output/prompt tokens; an "error" object is returned as the failure's kind.
std::string ApplyEvent(const std::string& data, double at_s, bool chat, RequestRecord& r,
                       Message& answer, double& last_s);

// One gRPC GenerateResponse at `at_s`, as ApplyEvent's token event: one chunk; its token id and
// text appended to `answer`; the output tokens counted exactly (usage set).
void ApplyMessage(const kvstream::v1::GenerateResponse& msg, double at_s, RequestRecord& r,
                  Message& answer, double& last_s);

}  // namespace kvstream::cli::serve
