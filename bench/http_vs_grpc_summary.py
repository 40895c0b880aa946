"""bench/http_vs_grpc.sh's table: per run (label), from `bench serve --requests-out` lines, TTFT and
ITL over all requests and over the steady part (requests after the first max_concurrency, which
start while the others decode); then the runs' own figures from --json-out, and per round HTTP
minus gRPC (TTFT p50/p99, steady) and HTTP/gRPC (ITL p50, steady).
  python3 bench/http_vs_grpc_summary.py REQUESTS.jsonl [RUNS.jsonl]
"""
import json
import sys


def pct(v, p):  # numpy's linear interpolation
    v = sorted(v)
    if not v:
        return 0.0
    k = (len(v) - 1) * p / 100.0
    f = int(k)
    c = min(f + 1, len(v) - 1)
    return v[f] + (v[c] - v[f]) * (k - f)


runs = {}
for line in open(sys.argv[1]):
    q = json.loads(line)
    runs.setdefault(q["label"], []).append(q)
print("| run | ok | TTFT p50 all | TTFT p99 all | steady n | TTFT p50 | TTFT p90 | TTFT p99 | ITL p50 | ITL p99 |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
steady = {}
for label, qs in runs.items():
    ok = [q for q in qs if q["ok"]]
    st = [q for q in ok if q["index"] >= q["max_concurrency"]]
    t_all = [q["ttft_ms"] for q in ok]
    t = [q["ttft_ms"] for q in st]
    itl = [g / 1e3 for q in st for g in q["itl_us"]]
    steady[label] = (pct(t, 50), pct(t, 99), pct(itl, 50))
    print(f"| {label} | {len(ok)}/{len(qs)} | {pct(t_all, 50):.2f} | {pct(t_all, 99):.2f} | {len(st)} | {pct(t, 50):.2f} | "
          f"{pct(t, 90):.2f} | {pct(t, 99):.2f} | {pct(itl, 50):.3f} | {pct(itl, 99):.3f} |")
print()
for label in sorted(steady):
    if label.startswith("http_") and "grpc_" + label[5:] in steady:
        h, g = steady[label], steady["grpc_" + label[5:]]
        print(f"round {label[5:]}: HTTP - gRPC TTFT p50 {h[0] - g[0]:+.2f} ms, p99 {h[1] - g[1]:+.2f} ms; "
              f"ITL p50 HTTP/gRPC {h[2] / g[2] if g[2] else 0:.3f}")
if len(sys.argv) > 2:
    print()
    for line in open(sys.argv[2]):
        j = json.loads(line)
        print(f"{j['label']}: {j['completed']} ok, {j['failed']} failed, {j['duration_s']:.2f} s, "
              f"{j['output_throughput']:.1f} tok/s; TTFT p50/p99 {j['median_ttft_ms']:.2f}/{j['p99_ttft_ms']:.2f} ms, "
              f"ITL p50/p99 {j['median_itl_ms']:.3f}/{j['p99_itl_ms']:.3f} ms")
