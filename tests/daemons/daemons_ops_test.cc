// What an operator touches besides the API: --version of every program, gRPC server reflection
// behind the daemons' authentication, and --log_format json (one JSON object per line).
#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include <google/protobuf/descriptor.pb.h>
#include <nlohmann/json.hpp>

#include "connector/client_auth.h"
#include "proto/reflection.grpc.pb.h"
#include "tests/daemons/disagg_fixture.h"

namespace kvstream::testing {
namespace {

namespace rv = grpc::reflection::v1alpha;

class OpsTest : public DisaggTest {};

TEST_F(OpsTest, EveryProgramPrintsItsVersion) {
  for (const auto& [name, bin] : {std::pair<std::string, std::string>{"kvstream-prefill", PrefillBin()},
                                  {"kvstream-decode", DecodeBin()},
                                  {"kvstream", KVSTREAM_CLI_BIN}}) {
    int rc = -1;
    const std::string out = RunCapture(bin + " --version", &rc);
    EXPECT_EQ(rc, 0) << name << ": " << out;
    std::istringstream in(out);
    std::string first, build, against;
    std::getline(in, first);
    std::getline(in, build);
    std::getline(in, against);
    EXPECT_EQ(first.rfind(name + " 0.", 0), 0u) << out;
    EXPECT_NE(first.find("(commit "), std::string::npos) << out;
    EXPECT_EQ(first.find("(commit )"), std::string::npos) << out;
    EXPECT_EQ(build.rfind("build: ", 0), 0u) << out;
    EXPECT_NE(build.find("transports: "), std::string::npos) << out;
    EXPECT_EQ(against.rfind("built against: CUDA ", 0), 0u) << out;
    for (const char* lib : {"UCX ", "gRPC 1.", "protobuf 3."})
      EXPECT_NE(against.find(lib), std::string::npos) << lib << " in " << out;
  }
}

// Reflection requests on one stream; the status of the stream.
grpc::Status Reflect(const std::string& address, const std::string& token,
                     const std::vector<rv::ServerReflectionRequest>& requests,
                     std::vector<rv::ServerReflectionResponse>* responses) {
  auto stub = rv::ServerReflection::NewStub(connector::CreateAuthChannel(address, {nullptr, token}));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto stream = stub->ServerReflectionInfo(&ctx);
  for (const auto& r : requests)
    if (!stream->Write(r)) break;
  stream->WritesDone();
  rv::ServerReflectionResponse resp;
  while (stream->Read(&resp)) responses->push_back(resp);
  return stream->Finish();
}

rv::ServerReflectionRequest ListServices() {
  rv::ServerReflectionRequest r;
  r.set_list_services("*");
  return r;
}
rv::ServerReflectionRequest FileContaining(const std::string& symbol) {
  rv::ServerReflectionRequest r;
  r.set_file_containing_symbol(symbol);
  return r;
}

std::vector<std::string> Names(const rv::ServerReflectionResponse& r) {
  std::vector<std::string> out;
  for (const auto& s : r.list_services_response().service()) out.push_back(s.name());
  return out;
}

TEST_F(OpsTest, ReflectionListsTheServicesAndTheirFiles) {
  DaemonPair pair;
  pair.common = {"--model=tiny"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));  // loopback, no credentials: open
  std::vector<rv::ServerReflectionResponse> r;
  grpc::Status s = Reflect(decode_address(), "",
                           {ListServices(), FileContaining("kvstream.v1.Decode"),
                            FileContaining("kvstream.v1.NoSuchThing")},
                           &r);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(Names(r[0]), (std::vector<std::string>{"kvstream.v1.Decode", "grpc.health.v1.Health",
                                                   "grpc.reflection.v1alpha.ServerReflection"}));
  ASSERT_GE(r[1].file_descriptor_response().file_descriptor_proto_size(), 1);
  google::protobuf::FileDescriptorProto file;
  ASSERT_TRUE(file.ParseFromString(r[1].file_descriptor_response().file_descriptor_proto(0)));
  EXPECT_EQ(file.name(), "kvstream.proto");
  EXPECT_EQ(file.package(), "kvstream.v1");
  bool has_generate = false;
  for (const auto& svc : file.service())
    for (const auto& m : svc.method()) has_generate |= svc.name() == "Decode" && m.name() == "Generate";
  EXPECT_TRUE(has_generate);
  EXPECT_EQ(r[2].error_response().error_code(), grpc::StatusCode::NOT_FOUND);

  r.clear();
  ASSERT_TRUE(Reflect(prefill_address(), "", {ListServices()}, &r).ok());
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(Names(r[0]).front(), "kvstream.v1.Prefill");
}

std::string WriteSecret(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text << "\n";
  chmod(path.c_str(), 0600);
  return path;
}

TEST_F(OpsTest, ReflectionNeedsACredentialWhenTheDaemonHasThem) {
  const std::string peer = "peer-0123456789abcdef0123456789abcdef";
  const std::string client = "client-0123456789abcdef0123456789abcdef";
  DaemonPair pair;
  pair.common = {"--model=tiny", "--peer_token_file=" + WriteSecret(dir_.path(), "peer.token", peer),
                 "--client_token_file=" + WriteSecret(dir_.path(), "client.token", client)};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  // Admitted as Stats is: a client on the decode; a client or a peer on the prefill.
  const std::vector<std::pair<std::string, std::vector<std::string>>> admitted = {
      {decode_address(), {client}}, {prefill_address(), {client, peer}}};
  for (const auto& [address, tokens] : admitted) {
    for (const std::string& token : {std::string(), std::string("wrong-0123456789abcdef0123")}) {
      std::vector<rv::ServerReflectionResponse> r;
      grpc::Status s = Reflect(address, token, {ListServices()}, &r);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
      EXPECT_TRUE(r.empty()) << "the service list reached a caller without a credential";
    }
    for (const std::string& token : tokens) {
      std::vector<rv::ServerReflectionResponse> r;
      grpc::Status s = Reflect(address, token, {ListServices()}, &r);
      EXPECT_TRUE(s.ok()) << s.error_message();
      EXPECT_EQ(r.size(), 1u);
    }
  }
}

TEST_F(OpsTest, JsonLogsAreOneObjectPerLine) {
  DaemonPair pair;
  pair.common = {"--model=tiny", "--log_format=json", "--log_level=debug"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  // A request whose tag holds what a text log would have to escape.
  auto stub = kvstream::v1::Decode::NewStub(
      connector::CreateAuthChannel(decode_address(), {nullptr, ""}));
  GenerateResult g = CallGenerate(*stub, MakePrompt(20, 512, 3), 3, kvstream::v1::LOAD_MODE_PIPELINED,
                                  20000);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  decode_->Signal(SIGTERM);
  prefill_->Signal(SIGTERM);
  EXPECT_EQ(decode_->Wait(DeadlineAfterMs(20000)), 0);
  EXPECT_EQ(prefill_->Wait(DeadlineAfterMs(20000)), 0);
  for (DaemonProcess* d : {prefill_.get(), decode_.get()}) {
    std::istringstream in(d->Log());
    int records = 0;
    bool saw_start = false, saw_stop = false;
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      // UCX writes its own lines (not ours to format); everything else is JSON.
      if (line.find("UCX ") != std::string::npos && line[0] != '{') continue;
      const auto j = nlohmann::json::parse(line, nullptr, false);
      ASSERT_TRUE(j.is_object()) << "not a JSON object: " << line;
      for (const char* key : {"time", "level", "file", "line", "msg"})
        EXPECT_TRUE(j.contains(key)) << key << " missing in " << line;
      const std::string msg = j.value("msg", "");
      saw_start |= msg.find("starting: {") != std::string::npos;
      saw_stop |= msg.find("stopped;") != std::string::npos;
      ++records;
    }
    EXPECT_GT(records, 3);
    EXPECT_TRUE(saw_start && saw_stop) << d->Log();
  }
}

}  // namespace
}  // namespace kvstream::testing
