#!/usr/bin/env python3
"""`kvstream bench serve` against tests/cli/fake_openai_server.py, which streams tokens at known
times: the metric definitions (TTFT, ITL, TPOT, E2EL, goodput) within a tolerance, the counts, the
JSON lines and CSV shapes, a rate sweep, the multi-turn prompts (previous prompt + answer + new
message, as token ids and as chat messages), the bearer token, error accounting (429, an error
event mid-stream, a server that is down), and the PNG plot when matplotlib is there.

    bench_serve_test.py KVSTREAM_BINARY
"""
import csv
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = sys.argv[1]
TTFT_MS, ITL_MS = 150.0, 40.0
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def bench(url, *args, rc_expected=0):
    cmd = [BIN, "bench", "serve", "--url", url, "--no-progress", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != rc_expected:
        print(p.stdout, p.stderr)
    check(p.returncode == rc_expected, "exit %d for %s" % (p.returncode, " ".join(args)))
    return p


def lines(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def main():
    tmp = tempfile.mkdtemp(prefix="bench_serve_")
    port_file, log = os.path.join(tmp, "port"), os.path.join(tmp, "requests.jsonl")
    server = subprocess.Popen([sys.executable, os.path.join(HERE, "fake_openai_server.py"), "--port-file",
                               port_file, "--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS), "--log", log])
    try:
        deadline = time.time() + 30
        while not os.path.exists(port_file) and time.time() < deadline:
            time.sleep(0.05)
        url = "http://127.0.0.1:" + open(port_file).read().strip()

        # Metric definitions on a controlled stream: 6 tokens, first at 150 ms, then every 40 ms.
        out = os.path.join(tmp, "m.jsonl")
        csv_out = os.path.join(tmp, "m.csv")
        bench(url, "--num-prompts", "12", "--input-len", "8", "--output-len", "6", "--max-concurrency", "4",
              "--request-rate", "40,inf", "--percentiles", "50,90,99", "--goodput", "ttft:1000", "e2el:5000",
              "--json-out", out, "--csv-out", csv_out, "--label", "fake")
        rows = lines(out)
        check(len(rows) == 2 and [r["request_rate"] for r in rows] == [40.0, "inf"], "one JSON line per rate")
        for r in rows:
            check(r["completed"] == 12 and r["failed"] == 0 and r["errors"] == {}, "12 completed, none failed")
            check(r["total_output_tokens"] == 72 and r["total_streamed_chunks"] == 72, "72 tokens = 72 chunks")
            check(r["total_input_tokens"] == 12 * 7, "input tokens from the server's usage")
            check(r["model"] == "fake" and r["label"] == "fake", "model from /v1/models, label")
            check(TTFT_MS <= r["median_ttft_ms"] < TTFT_MS + 120, "TTFT median %.1f ~ %g" % (r["median_ttft_ms"], TTFT_MS))
            check(ITL_MS - 10 < r["median_itl_ms"] < ITL_MS + 25, "ITL median %.1f ~ %g" % (r["median_itl_ms"], ITL_MS))
            check(ITL_MS - 10 < r["median_tpot_ms"] < ITL_MS + 25, "TPOT median %.1f ~ %g" % (r["median_tpot_ms"], ITL_MS))
            e2el = TTFT_MS + 5 * ITL_MS
            check(e2el <= r["median_e2el_ms"] < e2el + 150, "E2EL median %.1f ~ %g" % (r["median_e2el_ms"], e2el))
            # TPOT = (E2EL - TTFT) / (tokens - 1) per request: its mean equals the mean ITL here (5 gaps each).
            check(abs(r["mean_tpot_ms"] - r["mean_itl_ms"]) < 0.01, "mean TPOT = mean ITL for equal lengths")
            check(r["p50_ttft_ms"] == r["median_ttft_ms"], "p50 = median")
            check(abs(r["request_throughput"] * r["duration_s"] - 12) < 1e-6, "throughput = completed / duration")
            check(abs(r["output_throughput"] * r["duration_s"] - 72) < 1e-6, "output throughput = tokens / duration")
            check(r["request_goodput"] == r["request_throughput"], "every request within loose SLOs")
            check(r["max_concurrent_requests"] <= 4, "at most 4 in flight")
        check(rows[0]["duration_s"] >= 12 / 40.0, "rate 40: arrivals span 12/40 s")
        with open(csv_out) as f:
            table = list(csv.reader(f))
        check(len(table) == 3 and table[0][0] == "bench" and all(len(t) == len(table[0]) for t in table),
              "CSV: a header and one row per rate")
        check(table[2][table[0].index("errors")] == "", "CSV errors cell empty")
        # A TTFT SLO below the server's: no request is good.
        bench(url, "--num-prompts", "3", "--input-len", "4", "--output-len", "2", "--goodput", "ttft:100",
              "--json-out", os.path.join(tmp, "g.jsonl"))
        check(lines(os.path.join(tmp, "g.jsonl"))[0]["request_goodput"] == 0, "goodput 0 under a 100 ms TTFT SLO")

        # Errors, counted by kind: 429 in OpenAI's shape, an error event after a token.
        data = os.path.join(tmp, "prompts.jsonl")
        with open(data, "w") as f:
            for p in ["a b c", "REJECT me", "d e", "MIDERROR", "REJECT too", "f"]:
                f.write(json.dumps({"prompt": p, "max_tokens": 3}) + "\n")
        bench(url, "--dataset", "jsonl", "--dataset-path", data, "--num-prompts", "6",
              "--json-out", os.path.join(tmp, "e.jsonl"))
        r = lines(os.path.join(tmp, "e.jsonl"))[0]
        check(r["completed"] == 3 and r["failed"] == 3, "3 completed, 3 failed")
        check(r["errors"] == {"http 429 (queue_full)": 2, "error event (prefill_lost)": 1}, "errors %s" % r["errors"])

        # Multi-turn as token ids: each turn's prompt = the previous prompt + its answer + a new message.
        open(log, "w").close()
        token = os.path.join(tmp, "token")
        with open(token, "w") as f:
            f.write("bench-serve-test-token-0123456789\n")
        bench(url, "--dataset", "multiturn", "--conversations", "2", "--turns", "3", "--system-len", "5",
              "--input-len", "4", "--output-len", "2", "--prompt-format", "ids", "--vocab-size", "500",
              "--request-rate", "100", "--token-file", token, "--json-out", os.path.join(tmp, "t.jsonl"))
        r = lines(os.path.join(tmp, "t.jsonl"))[0]
        check(r["completed"] == 6 and r["dataset"] == "multiturn", "multi-turn: 6 turns completed")
        check("median_ttft_later_turns_ms" in r, "multi-turn: TTFT of later turns reported")
        reqs = [json.loads(l) for l in open(log)]
        check(all(q["auth"] == "Bearer bench-serve-test-token-0123456789" for q in reqs), "bearer token sent")
        prompts = [q["body"]["prompt"] for q in reqs]
        system = prompts[0][:5]
        check(all(p[:5] == system for p in prompts), "one system prompt shared")
        longer = 0
        for p in prompts:
            prev = [q for q in prompts if len(q) == len(p) - 6 and p[:len(q)] == q]
            if prev:
                longer += 1
                check(p[len(prev[0]):len(prev[0]) + 2] == [1000, 1001], "answer ids follow the previous prompt")
        check(longer == 4, "4 turns extend their conversation's previous prompt (%d)" % longer)

        # Chat: the earlier turns as user/assistant messages with the streamed answer.
        open(log, "w").close()
        bench(url, "--endpoint", "chat", "--dataset", "multiturn", "--conversations", "1", "--turns", "2",
              "--system-len", "3", "--input-len", "2", "--output-len", "2")
        msgs = [json.loads(l)["body"]["messages"] for l in open(log)]
        check([m["role"] for m in msgs[1]] == ["system", "user", "assistant", "user"], "chat turn 2's roles")
        check(msgs[1][2]["content"] == " t0 t1" and msgs[1][:2] == msgs[0], "chat turn 2 holds turn 1 and its answer")

        # A server that is down: every request fails, counted, exit 1.
        p = bench("http://127.0.0.1:1", "--model", "m", "--num-prompts", "3", "--input-len", "2",
                  "--json-out", os.path.join(tmp, "d.jsonl"), rc_expected=1)
        r = lines(os.path.join(tmp, "d.jsonl"))[0]
        check(r["failed"] == 3 and list(r["errors"].values()) == [3] and "connect" in list(r["errors"])[0],
              "server down: %s" % r["errors"])
        bench(url, "--dataset", "nope", rc_expected=2)

        # The plot, with Debian's matplotlib (/usr/bin/python3) where it is installed.
        py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
        if subprocess.run([py, "-c", "import matplotlib"], capture_output=True).returncode == 0:
            png = os.path.join(tmp, "plot.png")
            q = subprocess.run([py, os.path.join(ROOT, "scripts", "plot_bench_serve.py"), out, "-o", png],
                               capture_output=True, text=True, timeout=120)
            check(q.returncode == 0 and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n", "PNG plot " + q.stderr[-300:])
        else:
            print("skip the plot: no matplotlib")
    finally:
        server.kill()
        server.wait()
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
