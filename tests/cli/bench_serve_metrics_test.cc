// The pure parts of `kvstream bench serve`: vLLM's metric definitions on hand-made records,
// numpy's percentile, the SSE framing, the event parser, the SLO and URL flags, and the
// multi-turn request bodies.
#include <gtest/gtest.h>

#include <cmath>

#include "cli/serve/dataset.h"
#include "cli/serve/metrics.h"
#include "cli/serve/runner.h"
#include "cli/serve/sse_client.h"

namespace kvstream::cli::serve {
namespace {

using json = nlohmann::json;

TEST(BenchServeMetrics, PercentileInterpolatesAsNumpy) {
  // numpy.percentile([1, 2, 3, 4], q) = 2.5 (50), 3.7 (90), 3.97 (99), 1 (0), 4 (100).
  const std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 2.5);
  EXPECT_NEAR(Percentile(v, 90), 3.7, 1e-12);
  EXPECT_NEAR(Percentile(v, 99), 3.97, 1e-12);
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 4);
  EXPECT_DOUBLE_EQ(Percentile({}, 50), 0);  // vLLM: np.percentile(x or 0)
}

RequestRecord Rec(double start, double ttft, std::vector<double> itl, int out, int turn = 0) {
  RequestRecord r;
  r.ok = true;
  r.start_s = start;
  r.ttft_s = ttft;
  r.itl_s = itl;
  r.latency_s = ttft;
  for (double g : itl) r.latency_s += g;
  r.output_tokens = out;
  r.chunks = static_cast<int>(itl.size()) + 1;
  r.prompt_len = 10;
  r.usage = true;
  r.turn = turn;
  return r;
}

TEST(BenchServeMetrics, VllmDefinitions) {
  std::vector<RequestRecord> rs;
  rs.push_back(Rec(0.0, 0.1, {0.02, 0.04}, 3));      // e2el 0.16, tpot (0.16 - 0.1) / 2 = 0.03
  rs.push_back(Rec(0.5, 0.3, {}, 1));                // one token: no TPOT (0 for goodput)
  rs.push_back(Rec(1.0, 0.2, {0.05}, 4, 1));         // usage says 4 tokens in 2 chunks: tpot 0.05 / 3
  RequestRecord bad;
  bad.error = "http 429 (queue_full)";
  rs.push_back(bad);
  rs.push_back(bad);
  Slo slo;
  slo.ttft_ms = 250;
  slo.tpot_ms = 20;
  const RunMetrics m = ComputeMetrics(rs, 2.0, {50, 99}, slo);
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 2);
  EXPECT_EQ(m.errors.at("http 429 (queue_full)"), 2);
  EXPECT_EQ(m.total_input, 30);
  EXPECT_EQ(m.total_output, 8);
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(m.output_throughput, 4.0);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 19.0);
  // Good: the 1-token answer (ttft 300 ms fails), no; the first (ttft 100, tpot 30 > 20), no;
  // the third (ttft 200, tpot 16.7), yes.
  EXPECT_DOUBLE_EQ(m.request_goodput, 0.5);
  EXPECT_NEAR(m.ttft.mean, 200, 1e-9);
  EXPECT_NEAR(m.ttft.median, 200, 1e-9);
  EXPECT_NEAR(m.tpot.mean, (30 + 50.0 / 3) / 2, 1e-9);  // only requests with > 1 token
  EXPECT_NEAR(m.itl.mean, (20 + 40 + 50) / 3.0, 1e-9);   // pooled gaps
  EXPECT_NEAR(m.e2el.median, 250, 1e-9);                 // 160, 250, 300
  EXPECT_NEAR(m.ttft.std, std::sqrt((100.0 * 100 + 0 + 100 * 100) / 3), 1e-9);
  EXPECT_EQ(m.max_concurrent_requests, 1);  // [0, 0.16), [0.5, 0.8), [1.0, 1.25) do not overlap
  EXPECT_NEAR(m.ttft_later_turns.mean, 200, 1e-9);
  ASSERT_EQ(m.ttft.pct.size(), 2u);
  EXPECT_EQ(m.ttft.pct[1].first, 99);
}

TEST(BenchServeMetrics, PeakConcurrencyIsHalfOpen) {
  std::vector<RequestRecord> rs = {Rec(0, 0.5, {0.5}, 2), Rec(1.0, 0.5, {}, 1), Rec(0.2, 0.1, {}, 1)};
  const RunMetrics m = ComputeMetrics(rs, 2, {}, Slo{});
  EXPECT_EQ(m.max_concurrent_requests, 2);  // [0,1) and [0.2,0.3); [1,1.5) starts as the first ends
  EXPECT_DOUBLE_EQ(m.max_output_tokens_per_s, 2);  // tokens at 0.3, 0.5 | 1.0, 1.5
}

TEST(BenchServeMetrics, JsonAndCsv) {
  RunInfo info;
  info.request_rate = INFINITY;
  info.label = "a,b";
  const RunMetrics m = ComputeMetrics({Rec(0, 0.1, {0.1}, 2)}, 1, {90}, Slo{});
  const auto j = MetricsJson(info, m, Slo{});
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_TRUE(j.contains("p90_itl_ms"));
  EXPECT_FALSE(j.contains("request_goodput"));  // no SLO given
  const std::string csv = MetricsCsv({j, j});
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 3);
  EXPECT_NE(csv.find("\"a,b\""), std::string::npos);
}

TEST(BenchServeSse, FramingAcrossReads) {
  SseParser p;
  std::vector<std::string> got;
  auto on = [&](const std::string& d) { got.push_back(d); };
  p.Feed("data: {\"a\":1}\r\n\r\nda", on);
  p.Feed("ta: x\ndata: y\n", on);
  p.Feed(": comment\n\nevent: e\ndata:[DONE]\n\n", on);
  p.Feed("data: tail", on);
  p.Finish(on);
  EXPECT_EQ(got, (std::vector<std::string>{"{\"a\":1}", "x\ny", "[DONE]", "tail"}));
}

TEST(BenchServeSse, ApplyEvent) {
  RequestRecord r;
  Message answer;
  double last = 0;
  EXPECT_EQ(ApplyEvent(R"({"choices":[{"text":" a","token_ids":[7]}]})", 0.2, false, r, answer, last), "");
  EXPECT_EQ(ApplyEvent(R"({"choices":[{"text":" b","token_ids":[8]}]})", 0.25, false, r, answer, last), "");
  EXPECT_EQ(ApplyEvent(R"({"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}})", 0.3, false, r,
                       answer, last), "");
  EXPECT_DOUBLE_EQ(r.ttft_s, 0.2);
  ASSERT_EQ(r.itl_s.size(), 1u);
  EXPECT_NEAR(r.itl_s[0], 0.05, 1e-12);
  EXPECT_DOUBLE_EQ(last, 0.25);  // the usage chunk carries no choice: not the end of E2EL
  EXPECT_EQ(r.chunks, 2);
  EXPECT_EQ(r.output_tokens, 2);
  EXPECT_EQ(r.prompt_len, 5);
  EXPECT_EQ(answer.text, " a b");
  EXPECT_EQ(answer.ids, (std::vector<int32_t>{7, 8}));
  RequestRecord c;
  Message ca;
  EXPECT_EQ(ApplyEvent(R"({"choices":[{"delta":{"role":"assistant","content":"hi"}}]})", 1, true, c, ca, last), "");
  EXPECT_EQ(ca.text, "hi");
  EXPECT_EQ(ApplyEvent(R"({"error":{"message":"m","type":"server_error","code":"kv_pool_full"}})", 1, true, c, ca,
                       last), "kv_pool_full");
  EXPECT_EQ(ApplyEvent("not json", 1, true, c, ca, last), "event not JSON");
}

TEST(BenchServeFlags, SloAndUrl) {
  Slo s;
  std::string e;
  EXPECT_TRUE(ParseSlo("ttft:500 tpot:50,e2el:2000", &s, &e)) << e;
  EXPECT_EQ(*s.ttft_ms, 500);
  EXPECT_EQ(*s.tpot_ms, 50);
  EXPECT_EQ(*s.e2el_ms, 2000);
  EXPECT_FALSE(ParseSlo("itl:5", &s, &e));
  EXPECT_FALSE(ParseSlo("ttft:-1", &s, &e));
  auto u = ParseUrl("https://[::1]:8443/base/");
  ASSERT_TRUE(u.ok());
  EXPECT_TRUE(u->https);
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, "8443");
  EXPECT_EQ(u->base_path, "/base");
  EXPECT_EQ(ParseUrl("http://h")->port, "80");
  EXPECT_FALSE(ParseUrl("h:80").ok());
}

TEST(BenchServeDataset, MultiTurnBodies) {
  DatasetOptions o;
  o.kind = "multiturn";
  o.conversations = 2;
  o.turns = 2;
  o.system_len = 3;
  o.input_len = 2;
  o.output_len = 5;
  o.ids = true;
  o.vocab_size = 50;
  auto d = MakeDataset(o);
  ASSERT_TRUE(d.ok());
  ASSERT_EQ(d->size(), 2u);
  EXPECT_EQ((*d)[0].system.ids, (*d)[1].system.ids);
  BodyOptions b;
  b.model = "m";
  int len = 0;
  const json t0 = json::parse(RequestBody((*d)[0], 0, {}, b, &len));
  EXPECT_EQ(len, 5);
  Message answer;
  answer.ids = {40, 41};
  const json t1 = json::parse(RequestBody((*d)[0], 1, {answer}, b, &len));
  EXPECT_EQ(len, 9);
  auto p0 = t0["prompt"].get<std::vector<int>>(), p1 = t1["prompt"].get<std::vector<int>>();
  EXPECT_TRUE(std::equal(p0.begin(), p0.end(), p1.begin()));
  EXPECT_EQ(p1[5], 40);
  EXPECT_EQ(p1[6], 41);
  EXPECT_EQ(t1["return_token_ids"], true);
  EXPECT_EQ(t1["stream_options"]["include_usage"], true);
  EXPECT_EQ(t1["max_tokens"], 5);
  o.kind = "random";
  o.range_ratio = 0.5;
  o.num_prompts = 200;
  o.input_len = 10;
  auto r = MakeDataset(o);
  ASSERT_TRUE(r.ok());
  size_t lo = 99, hi = 0;
  for (const auto& c : *r) lo = std::min(lo, c.turns[0].user.ids.size()), hi = std::max(hi, c.turns[0].user.ids.size());
  EXPECT_EQ(lo, 5u);   // floor(10 * 0.5)
  EXPECT_EQ(hi, 15u);  // ceil(10 * 1.5)
  o.range_ratio = 1;
  EXPECT_FALSE(MakeDataset(o).ok());
}

}  // namespace
}  // namespace kvstream::cli::serve
