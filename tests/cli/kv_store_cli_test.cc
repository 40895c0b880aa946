// kvstream kv-store, run as an operator would against a real redis-server: probe (ok, a wrong
// password refused, no auth file refused as usage), erase (kvstream's keys gone, others kept).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>

#include "kvcache/redis_store.h"
#include "tests/kvcache/redis_server.h"

namespace kvstream {
namespace {

struct CliRun {
  int exit_code;
  std::string out;
};

CliRun KvStore(const std::string& flags) {
  const std::string cmd = std::string(KVSTREAM_BIN) + " kv-store " + flags + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

TEST(KvStoreCli, ProbeAndEraseEverything) {
  kvcache::testing::RedisServer a, b;
  const std::string servers = "unix:" + a.socket() + ",unix:" + b.socket();
  const std::string auth = a.AuthFile(a.password());
  kvcache::RedisStoreOptions o;
  o.servers = {"unix:" + a.socket(), "unix:" + b.socket()};
  o.auth_file = auth;
  auto store = kvcache::RedisStore::Open(o).value();
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(store->Put("k" + std::to_string(i), "v").ok());
  a.Cli({"SET", "foreign", "1"});

  CliRun probe = KvStore("probe --redis " + servers + " --auth-file " + auth);
  EXPECT_EQ(probe.exit_code, 0) << probe.out;
  EXPECT_NE(probe.out.find("unix:" + b.socket() + ": ok"), std::string::npos) << probe.out;
  CliRun wrong = KvStore("probe --redis " + servers + " --auth-file " + a.AuthFile("nope"));
  EXPECT_EQ(wrong.exit_code, 1) << wrong.out;
  EXPECT_NE(wrong.out.find("AUTH refused"), std::string::npos) << wrong.out;
  CliRun no_auth = KvStore("probe --redis " + servers);
  EXPECT_EQ(no_auth.exit_code, 2) << no_auth.out;
  EXPECT_NE(no_auth.out.find("auth_file is required"), std::string::npos) << no_auth.out;
  EXPECT_EQ(KvStore("frobnicate").exit_code, 2);

  CliRun erase = KvStore("erase --redis " + servers + " --auth-file " + auth);
  EXPECT_EQ(erase.exit_code, 0) << erase.out;
  EXPECT_NE(erase.out.find("erased 100 keys under 'kvstream:' on 2 server(s)"), std::string::npos)
      << erase.out;
  EXPECT_EQ(a.Cli({"DBSIZE"}), "1");
  EXPECT_EQ(b.Cli({"DBSIZE"}), "0");
}

}  // namespace
}  // namespace kvstream
