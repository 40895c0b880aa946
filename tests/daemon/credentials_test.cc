// daemon/credentials: loopback detection, constant-time compare, token files, the TLS keys'
// checks and the start-up rule (a non-loopback address needs credentials or --insecure).
#include "daemon/credentials.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>

namespace kvstream::daemon {
namespace {

Result<DaemonConfig> Parse(std::vector<std::string> args, const std::string& role) {
  args.insert(args.begin(), "kvstream-" + role);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return ParseDaemonConfig(static_cast<int>(argv.size()), argv.data(), role);
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/kvstream_cred_" + name;
  std::ofstream(path) << text;
  chmod(path.c_str(), 0600);
  return path;
}

TEST(Credentials, LoopbackAddresses) {
  for (const char* a : {"127.0.0.1:0", "127.1.2.3:50051", "localhost:7000", "[::1]:7000",
                        "::1:7000", "[::ffff:127.0.0.1]:1", "unix:/tmp/kv.sock",
                        "dns:///localhost:80", "ipv4:127.0.0.1:5"})
    EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  for (const char* a : {"0.0.0.0:50051", "[::]:50051", ":50051", "10.0.0.1:1", "128.0.0.1:1",
                        "kvstream-prefill:50061", "localhost.example.com:1", "[::2]:1",
                        "127.0.0.1.evil.com:1"})
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
}

TEST(Credentials, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("abcdef", "abcdef"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("abcdef", "abcdeg"));
  EXPECT_FALSE(ConstantTimeEquals("abcdef", "abcde"));
  EXPECT_FALSE(ConstantTimeEquals("abcde", "abcdef"));
  EXPECT_FALSE(ConstantTimeEquals(std::string_view("ab\0", 3), "ab"));
  EXPECT_FALSE(ConstantTimeEquals("x", ""));
}

TEST(Credentials, TokenFiles) {
  auto ok = ReadTokenFile("peer_token_file", WriteFile("ok", "  0123456789abcdef0123\n"));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(*ok, "0123456789abcdef0123");
  for (const auto& [name, text] : std::vector<std::pair<std::string, std::string>>{
           {"empty", ""}, {"blank", " \n\t\n"}, {"short", "0123456789\n"},
           {"space", "0123456789 abcdef0123"}}) {
    auto r = ReadTokenFile("client_token_file", WriteFile(name, text));
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(r.status().message().find("client_token_file"), std::string::npos)
        << r.status().message();
    // The message names the file, never the secret.
    if (name == "space") {
      EXPECT_EQ(r.status().message().find("abcdef0123"), std::string::npos);
    }
  }
  auto missing = ReadTokenFile("peer_token_file", "/nonexistent/kvstream.token");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("peer_token_file"), std::string::npos);
}

TEST(Credentials, TlsKeysGoTogether) {
  auto c = Parse({"--tls_cert=a.pem", "--tls_key=a.key"}, "prefill");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("tls_ca"), std::string::npos) << c.status().message();
  c = Parse({"--tls_cert=a.pem", "--tls_key=a.key", "--tls_ca=ca.pem"}, "prefill");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("tls_peer_names"), std::string::npos);
  c = Parse({"--tls_cert=a.pem", "--tls_key=a.key", "--tls_ca=ca.pem", "--peer=127.0.0.1:1"},
            "decode");
  EXPECT_TRUE(c.ok()) << c.status().ToString();  // the decode serves no peer method
  EXPECT_FALSE(Parse({"--tls_reload_s=0"}, "prefill").ok());
}

TEST(Credentials, InsecureIsABooleanFlag) {
  auto c = Parse({"--insecure"}, "prefill");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->insecure);
  c = Parse({"--insecure", "--pool_blocks=8"}, "prefill");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->insecure);
  EXPECT_EQ(c->pool_blocks, 8);
  c = Parse({"--insecure", "false"}, "prefill");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->insecure);
  c = Parse({"--pipelining", "false"}, "prefill");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->pipelining);
}

TEST(Credentials, NonLoopbackNeedsCredentialsOrInsecure) {
  auto cfg = Parse({"--listen=0.0.0.0:0"}, "prefill");
  ASSERT_TRUE(cfg.ok());
  auto s = SecurityFromConfig(*cfg, "prefill");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  for (const char* key : {"tls_cert", "peer_token_file", "--insecure"})
    EXPECT_NE(s.status().message().find(key), std::string::npos) << s.status().message();

  cfg = Parse({"--listen=0.0.0.0:0", "--insecure"}, "prefill");
  ASSERT_TRUE(cfg.ok());
  s = SecurityFromConfig(*cfg, "prefill");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(s->authorizer->open());

  const std::string token = WriteFile("peer", "0123456789abcdef0123456789abcdef\n");
  cfg = Parse({"--listen=0.0.0.0:0", "--peer_token_file=" + token}, "prefill");
  ASSERT_TRUE(cfg.ok());
  s = SecurityFromConfig(*cfg, "prefill");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_FALSE(s->authorizer->open());

  // The decode: its listener needs the client token, a remote prefill the peer token.
  cfg = Parse({"--listen=0.0.0.0:0", "--peer=127.0.0.1:1", "--peer_token_file=" + token}, "decode");
  ASSERT_TRUE(cfg.ok());
  s = SecurityFromConfig(*cfg, "decode");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("client_token_file"), std::string::npos);
  cfg = Parse({"--listen=127.0.0.1:0", "--peer=127.0.0.1:1,10.0.0.2:1"}, "decode");
  ASSERT_TRUE(cfg.ok());
  s = SecurityFromConfig(*cfg, "decode");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("10.0.0.2:1"), std::string::npos);
  EXPECT_NE(s.status().message().find("peer_token_file"), std::string::npos);
  cfg = Parse({"--listen=127.0.0.1:0", "--peer=10.0.0.2:1", "--peer_token_file=" + token}, "decode");
  ASSERT_TRUE(cfg.ok());
  s = SecurityFromConfig(*cfg, "decode");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->peer_token, "0123456789abcdef0123456789abcdef");
  EXPECT_TRUE(s->authorizer->open());  // loopback listener, no client token: as before

  // Loopback without credentials: every call admitted, as before.
  cfg = Parse({"--listen=127.0.0.1:0"}, "prefill");
  ASSERT_TRUE(cfg.ok());
  s = SecurityFromConfig(*cfg, "prefill");
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->authorizer->open());
}

TEST(Credentials, UnreadableCertificateNamesTheKey) {
  auto cfg = Parse({"--tls_cert=/nonexistent/c.pem", "--tls_key=/nonexistent/c.key",
                    "--tls_ca=/nonexistent/ca.pem", "--tls_peer_names=decode"},
                   "prefill");
  ASSERT_TRUE(cfg.ok());
  auto s = SecurityFromConfig(*cfg, "prefill");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("tls_cert"), std::string::npos) << s.status().message();
  const std::string not_pem = WriteFile("notpem", "hello\n");
  cfg = Parse({"--tls_cert=" + not_pem, "--tls_key=" + not_pem, "--tls_ca=" + not_pem,
               "--tls_peer_names=decode"},
              "prefill");
  ASSERT_TRUE(cfg.ok());
  s = SecurityFromConfig(*cfg, "prefill");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("no PEM"), std::string::npos) << s.status().message();
}

}  // namespace
}  // namespace kvstream::daemon
