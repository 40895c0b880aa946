// Control-plane authentication against the real daemons (docs/security.md): bearer tokens per
// method, mTLS with certificates made here by the openssl CLI, certificate reload, and the
// start-up rule for non-loopback addresses.
#include <signal.h>
#include <sys/stat.h>

#include <fstream>
#include <thread>

#include "connector/client_auth.h"
#include "connector/handshake.h"
#include "daemon/daemon_runtime.h"
#include "daemon/credentials.h"
#include "tests/daemons/disagg_fixture.h"
#include "tests/fault_record.h"
#include "transport/transport.h"

namespace kvstream::testing {
namespace {

namespace v1 = kvstream::v1;

const std::vector<std::string> kTiny = {"--model=tiny"};

class AuthTest : public DisaggTest {};

std::string WriteSecret(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text << "\n";
  chmod(path.c_str(), 0600);
  return path;
}

std::shared_ptr<grpc::Channel> Channel(const std::string& address, const std::string& token,
                                       std::shared_ptr<grpc::ChannelCredentials> creds = nullptr) {
  return connector::CreateAuthChannel(address, {std::move(creds), token});
}
std::shared_ptr<grpc::ChannelCredentials> Tls(const std::string& dir, const std::string& ca,
                                              const std::string& cert) {
  auto c = daemon::ClientChannelCredentials(dir + "/" + ca + ".pem",
                                            cert.empty() ? "" : dir + "/" + cert + ".pem",
                                            cert.empty() ? "" : dir + "/" + cert + ".key", 1);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : nullptr;
}

grpc::ClientContext* WithDeadline(grpc::ClientContext* ctx, int ms = 5000) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
  return ctx;
}

// Each Prefill-service method with an empty request: the status only.
struct PrefillCalls {
  grpc::Status handshake, prefill, cancel, stats;
};
PrefillCalls CallPrefillMethods(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = v1::Prefill::NewStub(channel);
  PrefillCalls r;
  {
    grpc::ClientContext ctx;
    v1::HandshakeResponse resp;
    r.handshake = stub->Handshake(WithDeadline(&ctx), v1::HandshakeRequest(), &resp);
  }
  {
    grpc::ClientContext ctx;
    auto reader = stub->Prefill(WithDeadline(&ctx), v1::PrefillRequest());
    v1::PrefillProgress p;
    while (reader->Read(&p)) {
    }
    r.prefill = reader->Finish();
  }
  {
    grpc::ClientContext ctx;
    v1::CancelResponse resp;
    r.cancel = stub->Cancel(WithDeadline(&ctx), v1::CancelRequest(), &resp);
  }
  {
    grpc::ClientContext ctx;
    v1::StatsResponse resp;
    r.stats = stub->Stats(WithDeadline(&ctx), v1::StatsRequest(), &resp);
  }
  return r;
}

grpc::Status DecodeStats(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = v1::Decode::NewStub(channel);
  grpc::ClientContext ctx;
  v1::StatsResponse resp;
  return stub->Stats(WithDeadline(&ctx), v1::StatsRequest(), &resp);
}

TEST_F(AuthTest, TokensGuardEveryMethod) {
  const std::string peer = "peer-0123456789abcdef0123456789abcdef";
  const std::string client = "client-0123456789abcdef0123456789abcdef";
  const std::string wrong = "wrong-0123456789abcdef0123456789abcdef";
  DaemonPair pair;
  pair.common = kTiny;
  pair.common.push_back("--peer_token_file=" + WriteSecret(dir_.path(), "peer.token", peer));
  pair.common.push_back("--client_token_file=" + WriteSecret(dir_.path(), "client.token", client));
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));

  // The prefill: nothing without a token or with a wrong one; a client only Stats.
  for (const std::string& token : {std::string(), wrong}) {
    PrefillCalls r = CallPrefillMethods(Channel(prefill_address(), token));
    for (const grpc::Status* s : {&r.handshake, &r.prefill, &r.cancel, &r.stats}) {
      EXPECT_EQ(s->error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << "token '" << token << "': " << s->error_message();
      EXPECT_EQ(s->error_message().find(wrong), std::string::npos) << s->error_message();
    }
  }
  PrefillCalls as_client = CallPrefillMethods(Channel(prefill_address(), client));
  for (const grpc::Status* s : {&as_client.handshake, &as_client.prefill, &as_client.cancel}) {
    EXPECT_EQ(s->error_code(), grpc::StatusCode::PERMISSION_DENIED) << s->error_message();
    EXPECT_NE(s->error_message().find("peer"), std::string::npos) << s->error_message();
    EXPECT_EQ(s->error_message().find(client), std::string::npos) << s->error_message();
  }
  EXPECT_TRUE(as_client.stats.ok()) << as_client.stats.error_message();
  // The peer token passes the authorization (the empty requests then fail their own checks).
  PrefillCalls as_peer = CallPrefillMethods(Channel(prefill_address(), peer));
  for (const grpc::Status* s : {&as_peer.handshake, &as_peer.prefill, &as_peer.cancel})
    EXPECT_TRUE(s->error_code() != grpc::StatusCode::UNAUTHENTICATED &&
                s->error_code() != grpc::StatusCode::PERMISSION_DENIED)
        << s->error_message();

  // The decode: Generate and Stats need the client token.
  const auto prompt = MakePrompt(40, 512, 7);
  for (const std::string& token : {std::string(), wrong}) {
    auto stub = v1::Decode::NewStub(Channel(decode_address(), token));
    GenerateResult g = CallGenerate(*stub, prompt, 4, v1::LOAD_MODE_PIPELINED, 10000);
    EXPECT_EQ(g.status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << g.status.error_message();
    EXPECT_TRUE(g.tokens.empty());
    EXPECT_EQ(DecodeStats(Channel(decode_address(), token)).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  // With it: the decode's load from the prefill (peer token between the daemons) lands.
  auto stub = v1::Decode::NewStub(Channel(decode_address(), client));
  GenerateResult g = CallGenerate(*stub, prompt, 4, v1::LOAD_MODE_PIPELINED, 30000);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.tokens, Colocated(kTiny, prompt, 4));
  EXPECT_TRUE(g.messages.front().load().loaded_remotely());
  EXPECT_TRUE(DecodeStats(Channel(decode_address(), client)).ok());
  // No token of the peer leaks into the logs.
  EXPECT_EQ(prefill_->Log().find(peer), std::string::npos);
  EXPECT_EQ(decode_->Log().find(client), std::string::npos);
  FaultOutcome o;
  o.tries = 2 * 4 + 3 + 2 * 2;  // prefill methods without / with a wrong token, as a client; decode
  o.requests = 3;
  o.lost = g.status.ok() ? 0 : 1;
  o.wrong_tokens = g.tokens == Colocated(kTiny, prompt, 4) ? 0 : 1;
  o.aborts = prefill_->Running() && decode_->Running() ? 0 : 1;
  o.outcome = "no or a wrong token: UNAUTHENTICATED on every method; the client token on a peer "
              "method: PERMISSION_DENIED; no secret in a message or log; with the right tokens the "
              "load landed and the tokens were right";
  RecordFault("control.tokens_per_method",
              "calls to every method of both daemons without a token, with a wrong one, and with "
              "the client token on the prefill's peer methods",
              o);
}

TEST_F(AuthTest, MutualTlsEndToEnd) {
  const std::string d = dir_.path();
  ASSERT_NO_FATAL_FAILURE(MakeCa(d, "ca"));
  ASSERT_NO_FATAL_FAILURE(MakeCa(d, "rogue-ca"));
  for (const char* n : {"prefill", "decode", "client"}) ASSERT_NO_FATAL_FAILURE(MakeCert(d, "ca", n, n));
  // A certificate with a peer's name from a CA the daemons do not trust.
  ASSERT_NO_FATAL_FAILURE(MakeCert(d, "rogue-ca", "decode", "rogue"));
  auto tls_flags = [&](const std::string& n) {
    return std::vector<std::string>{"--tls_cert=" + d + "/" + n + ".pem",
                                    "--tls_key=" + d + "/" + n + ".key", "--tls_ca=" + d + "/ca.pem"};
  };
  DaemonPair pair;
  pair.common = kTiny;
  pair.prefill = tls_flags("prefill");
  pair.prefill.push_back("--tls_peer_names=decode");
  pair.decode = tls_flags("decode");
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));

  // A client certificate: Generate end to end (the decode reached the prefill over mTLS).
  const auto prompt = MakePrompt(40, 512, 9);
  auto stub = v1::Decode::NewStub(Channel(decode_address(), "", Tls(d, "ca", "client")));
  GenerateResult g = CallGenerate(*stub, prompt, 4, v1::LOAD_MODE_PIPELINED, 30000);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.tokens, Colocated(kTiny, prompt, 4));
  EXPECT_TRUE(g.messages.front().load().loaded_remotely());

  // No certificate, plaintext, or an untrusted CA: no connection at all.
  EXPECT_FALSE(DecodeStats(Channel(decode_address(), "", Tls(d, "ca", ""))).ok());
  EXPECT_FALSE(DecodeStats(Channel(decode_address(), "")).ok());
  PrefillCalls rogue = CallPrefillMethods(Channel(prefill_address(), "", Tls(d, "ca", "rogue")));
  EXPECT_EQ(rogue.handshake.error_code(), grpc::StatusCode::UNAVAILABLE) << rogue.handshake.error_message();
  EXPECT_FALSE(rogue.stats.ok());

  // A verified certificate not named in tls_peer_names is a client: Stats only.
  PrefillCalls as_client = CallPrefillMethods(Channel(prefill_address(), "", Tls(d, "ca", "client")));
  for (const grpc::Status* s : {&as_client.handshake, &as_client.prefill, &as_client.cancel})
    EXPECT_EQ(s->error_code(), grpc::StatusCode::PERMISSION_DENIED) << s->error_message();
  EXPECT_TRUE(as_client.stats.ok()) << as_client.stats.error_message();
  // The peer's certificate passes the authorization (Cancel of an unknown request is OK).
  PrefillCalls as_peer = CallPrefillMethods(Channel(prefill_address(), "", Tls(d, "ca", "decode")));
  EXPECT_TRUE(as_peer.cancel.ok()) << as_peer.cancel.error_message();
  FaultOutcome o;
  o.tries = 2 + 4 + 3;  // no certificate / plaintext; a rogue CA's peer name; a client's on peer methods
  o.requests = 1;
  o.lost = g.status.ok() ? 0 : 1;
  o.wrong_tokens = g.tokens == Colocated(kTiny, prompt, 4) ? 0 : 1;
  o.aborts = prefill_->Running() && decode_->Running() ? 0 : 1;
  o.outcome = "no certificate, plaintext, or a certificate from an untrusted CA: no connection; a "
              "client certificate on a peer method: PERMISSION_DENIED; mTLS end to end served right";
  RecordFault("control.mtls_untrusted_certificates",
              "callers with no client certificate, plaintext, a peer's name from a rogue CA, and a "
              "client certificate on the prefill's peer methods",
              o);
}

// Sessions are bound to the authenticated identity that made them (issue 15, item 2): after a
// prefill restart, another authenticated peer (its own certificate, also named a peer) that
// handshakes first under the decode's public instance id binds it only within its own identity;
// the decode's next request handshakes under its certificate and is served right. Failed
// before: the decode's handshake was refused (PERMISSION_DENIED) until the prefill restarted.
TEST_F(AuthTest, AnotherPeerCannotClaimADecodeIdAfterAPrefillRestart) {
  const std::string d = dir_.path();
  ASSERT_NO_FATAL_FAILURE(MakeCa(d, "ca"));
  for (const char* n : {"prefill", "decode", "other", "client"}) {
    ASSERT_NO_FATAL_FAILURE(MakeCert(d, "ca", n, n));
  }
  auto tls_flags = [&](const std::string& n) {
    return std::vector<std::string>{"--tls_cert=" + d + "/" + n + ".pem",
                                    "--tls_key=" + d + "/" + n + ".key", "--tls_ca=" + d + "/ca.pem"};
  };
  DaemonPair pair;
  pair.common = kTiny;
  pair.prefill = tls_flags("prefill");
  pair.prefill.push_back("--tls_peer_names=decode,other");
  pair.decode = tls_flags("decode");
  pair.prefill_port = PickFreePort();  // the restarted prefill comes back on the same port
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  const auto prompt = MakePrompt(40, 512, 12);
  const std::vector<int32_t> want = Colocated(kTiny, prompt, 4);
  auto stub = v1::Decode::NewStub(Channel(decode_address(), "", Tls(d, "ca", "client")));
  GenerateResult first = CallGenerate(*stub, prompt, 4, v1::LOAD_MODE_PIPELINED, 30000);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  std::string decode_id;
  {
    grpc::ClientContext ctx;
    v1::StatsResponse resp;
    ASSERT_TRUE(stub->Stats(WithDeadline(&ctx), v1::StatsRequest(), &resp).ok());
    decode_id = resp.instance_id();
  }
  prefill_->Signal(SIGKILL);
  prefill_->Wait(DeadlineAfterMs(5000));
  ASSERT_NO_FATAL_FAILURE(StartPrefill());

  // The other peer claims the decode's id first, with a handshake the prefill accepts: the
  // tiny layout, a UCX transport and a registered pool of its own.
  daemon::DaemonConfig cfg;
  cfg.model = "tiny";
  cfg.threads = 1;
  auto model = daemon::LoadServingModel(cfg);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const connector::LayoutDescriptor layout =
      connector::MakeLayoutDescriptor(model->backend->config(), cfg.block_size);
  std::vector<uint8_t> pool(layout.layout.pool_bytes(8));
  transport::TransportOptions to;
  to.backend = "ucx";
  to.ucx.tls = "tcp";
  to.ucx.net_devices = "lo";
  auto t = transport::CreateTransport(to);
  if (t.status().code() == StatusCode::kNotSupported) GTEST_SKIP() << t.status().ToString();
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto reg = (*t)->Register(transport::MemoryRegion{pool.data(), pool.size()});
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  v1::HandshakeRequest claim;
  claim.set_decode_instance_id(decode_id);
  claim.set_transport_address((*t)->LocalAddress());
  auto* region = claim.add_regions();
  region->set_addr(reinterpret_cast<uint64_t>(pool.data()));
  region->set_length(pool.size());
  region->set_key((*reg)->RemoteKey());
  claim.set_pool_blocks(8);
  connector::ToProto(layout, claim.mutable_layout());
  claim.set_transport_backend((*t)->name());
  claim.set_session_secret(std::string(32, 'o'));
  {
    auto other = v1::Prefill::NewStub(Channel(prefill_address(), "", Tls(d, "ca", "other")));
    grpc::ClientContext ctx;
    v1::HandshakeResponse resp;
    grpc::Status s = other->Handshake(WithDeadline(&ctx, 20000), claim, &resp);
    ASSERT_TRUE(s.ok()) << "the other peer's handshake: " << s.error_message();
  }
  GenerateResult after = CallGenerate(*stub, prompt, 4, v1::LOAD_MODE_PIPELINED, 30000);
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.tokens, want);
  EXPECT_TRUE(after.messages.front().load().loaded_remotely());
  FaultOutcome o;
  o.tries = 1;
  o.requests = 1;
  o.lost = after.status.ok() ? 0 : 1;
  o.wrong_tokens = after.tokens == want ? 0 : 1;
  o.aborts = prefill_->Running() && decode_->Running() ? 0 : 1;
  o.outcome = "the claim made a session of the other identity only; the decode handshook under its "
              "own certificate and its next request loaded remotely with the right tokens";
  RecordFault("control.claimed_decode_id_after_restart",
              "after a prefill restart, another authenticated peer handshakes first under a "
              "running decode's public instance id",
              o);
}

// The CN of the certificate `address` serves now (a fresh connection), or "" if none.
std::string ServedCommonName(const std::string& address,
                             std::shared_ptr<grpc::ChannelCredentials> creds) {
  auto stub = v1::Prefill::NewStub(Channel(address, "", std::move(creds)));
  grpc::ClientContext ctx;
  v1::StatsResponse resp;
  if (!stub->Stats(WithDeadline(&ctx, 3000), v1::StatsRequest(), &resp).ok()) return "";
  auto names = ctx.auth_context()->FindPropertyValues("x509_common_name");
  return names.empty() ? "" : std::string(names.front().data(), names.front().size());
}

TEST_F(AuthTest, CertificatesReloadWithoutRestart) {
  const std::string d = dir_.path();
  ASSERT_NO_FATAL_FAILURE(MakeCa(d, "ca"));
  ASSERT_NO_FATAL_FAILURE(MakeCa(d, "ca2"));
  ASSERT_NO_FATAL_FAILURE(MakeCert(d, "ca", "prefill", "prefill"));
  ASSERT_NO_FATAL_FAILURE(MakeCert(d, "ca", "client", "client"));
  ASSERT_NO_FATAL_FAILURE(MakeCert(d, "ca2", "client2", "client2"));
  // tls_ca is a copy of ca.pem that the test rewrites.
  ASSERT_EQ(std::system(("cp " + d + "/ca.pem " + d + "/trusted.pem").c_str()), 0);
  DaemonPair pair;
  pair.common = kTiny;
  pair.prefill = {"--tls_cert=" + d + "/prefill.pem", "--tls_key=" + d + "/prefill.key",
                  "--tls_ca=" + d + "/trusted.pem", "--tls_peer_names=decode", "--tls_reload_s=1"};
  pair_ = pair;
  ASSERT_NO_FATAL_FAILURE(StartPrefill());
  const std::string address = prefill_address();
  EXPECT_EQ(ServedCommonName(address, Tls(d, "ca", "client")), "prefill");
  EXPECT_EQ(ServedCommonName(address, Tls(d, "ca2", "client2")), "");  // ca2 not trusted yet

  // A new server certificate (same CA) and a CA bundle that adds ca2, replaced in place.
  ASSERT_NO_FATAL_FAILURE(MakeCert(d, "ca", "prefill-renewed", "prefill"));
  ASSERT_EQ(std::system(("cat " + d + "/ca.pem " + d + "/ca2.pem > " + d + "/trusted.new && mv " +
                         d + "/trusted.new " + d + "/trusted.pem").c_str()),
            0);
  // The client trusts both CAs too (the renewed server certificate is from ca).
  ASSERT_EQ(std::system(("cp " + d + "/trusted.pem " + d + "/both.pem").c_str()), 0);
  std::string cn, cn2;
  const auto deadline = DeadlineAfterMs(15000);
  while (Clock::now() < deadline) {
    cn = ServedCommonName(address, Tls(d, "ca", "client"));
    cn2 = ServedCommonName(address, Tls(d, "both", "client2"));
    if (cn == "prefill-renewed" && cn2 == "prefill-renewed") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(cn, "prefill-renewed");
  EXPECT_EQ(cn2, "prefill-renewed") << "a client of the added CA is not admitted after reload";
  EXPECT_TRUE(prefill_->Running());
}

TEST_F(AuthTest, NonLoopbackNeedsCredentialsOrInsecure) {
  auto run = [&](const std::string& name, const std::string& bin, std::vector<std::string> args) {
    std::vector<std::string> all = DefaultDaemonFlags();
    all.insert(all.end(), kTiny.begin(), kTiny.end());
    all.insert(all.end(), args.begin(), args.end());
    return std::make_unique<DaemonProcess>(name, bin, all, dir_.path());
  };
  struct Case {
    std::string name, bin;
    std::vector<std::string> args;
    std::string key;  // named in the message
  };
  const std::string empty = WriteSecret(dir_.path(), "empty.token", "");
  const std::vector<Case> refused = {
      {"p-any", PrefillBin(), {"--listen=0.0.0.0:0"}, "peer_token_file"},
      {"p-v6", PrefillBin(), {"--listen=[::]:0"}, "--insecure"},
      {"d-any", DecodeBin(), {"--listen=0.0.0.0:0", "--peer=127.0.0.1:1"}, "client_token_file"},
      {"d-peer", DecodeBin(), {"--listen=127.0.0.1:0", "--peer=192.0.2.1:1"}, "peer_token_file"},
      {"p-empty-token", PrefillBin(), {"--peer_token_file=" + empty}, "peer_token_file"},
  };
  int started = 0;
  for (const Case& c : refused) {
    auto p = run(c.name, c.bin, c.args);
    ASSERT_TRUE(p->Spawn().ok());
    const int rc = p->Wait(DeadlineAfterMs(20000));
    EXPECT_EQ(rc, 2) << c.name << ":\n" << p->Log();
    if (rc != 2) ++started;
    EXPECT_NE(p->Log().find(c.key), std::string::npos) << c.name << ":\n" << p->Log();
  }
  {
    FaultOutcome o;
    o.tries = static_cast<int>(refused.size());
    o.aborts = 0;
    o.outcome = std::to_string(refused.size() - started) + " of " + std::to_string(refused.size()) +
                " refused to start (exit 2, naming the key to set); with --insecure it serves";
    RecordFault("control.non_loopback_without_credentials",
                "daemons started on 0.0.0.0 / [::] or pointed at a non-loopback peer without "
                "credentials, or with an empty token file",
                o);
  }
  // --insecure: it starts and serves.
  auto p = run("p-insecure", PrefillBin(), {"--listen=0.0.0.0:0", "--insecure"});
  Status s = p->Start(DeadlineAfterMs(60000));
  ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << p->Log();
  auto stats = CallStats(*PrefillStub(p->address()));
  EXPECT_TRUE(stats.ok()) << stats.status().ToString();
}

}  // namespace
}  // namespace kvstream::testing
