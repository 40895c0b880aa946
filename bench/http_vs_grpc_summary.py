"""bench/http_vs_grpc.sh's tables, from its OUT directory:
- TTFT of the probes (one request at a time per path while the background decodes), per round
  and pooled: p50/p99 per path, HTTP minus gRPC, the median of the per-index differences (the
  same prompt on both paths within a round), and the mean over the rounds of HTTP minus gRPC;
- inter-token latency of the background streams of each path over the probes' window (both
  paths' streams in the same decode steps): p50/p90/p99, HTTP/gRPC;
- each background stream's end against the probes' end (the load held throughout, or not).
  python3 bench/http_vs_grpc_summary.py OUT
"""
import json
import os
import sys


def pct(v, p):  # numpy's linear interpolation
    v = sorted(v)
    if not v:
        return float("nan")
    k = (len(v) - 1) * p / 100.0
    f = int(k)
    c = min(f + 1, len(v) - 1)
    return v[f] + (v[c] - v[f]) * (k - f)


def lines(path):
    return [json.loads(l) for l in open(path) if l.strip()] if os.path.exists(path) else []


out = sys.argv[1]
win = dict(l.split() for l in open(os.path.join(out, "window.txt")))
w0 = float(win["probe_start"]) - float(win["bg_start"])
w1 = float(win["probe_end"]) - float(win["bg_start"])

probes = {}
for q in lines(os.path.join(out, "probe_requests.jsonl")):
    probes.setdefault(q["label"], []).append(q)
rounds = sorted({int(l.split("_")[1]) for l in probes})
print(f"TTFT of the probes (ms; {len(rounds)} rounds; window {w0:.1f}-{w1:.1f} s of the background)")
print("| round | gRPC ok | HTTP ok | gRPC p50 | HTTP p50 | HTTP - gRPC p50 | gRPC p99 | HTTP p99 | HTTP - gRPC p99 | median of pair differences |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
allg, allh, diffs, rd50, rd99 = [], [], [], [], []
for r in rounds:
    g = {q["index"]: q["ttft_ms"] for q in probes.get(f"grpc_{r}", []) if q["ok"]}
    h = {q["index"]: q["ttft_ms"] for q in probes.get(f"http_{r}", []) if q["ok"]}
    d = [h[i] - g[i] for i in g if i in h]
    allg += list(g.values()); allh += list(h.values()); diffs += d
    rd50.append(pct(h.values(), 50) - pct(g.values(), 50)); rd99.append(pct(h.values(), 99) - pct(g.values(), 99))
    print(f"| {r} | {len(g)} | {len(h)} | {pct(g.values(), 50):.2f} | {pct(h.values(), 50):.2f} | "
          f"{pct(h.values(), 50) - pct(g.values(), 50):+.2f} | {pct(g.values(), 99):.2f} | {pct(h.values(), 99):.2f} | "
          f"{pct(h.values(), 99) - pct(g.values(), 99):+.2f} | {pct(d, 50):+.2f} |")
print(f"| all | {len(allg)} | {len(allh)} | {pct(allg, 50):.2f} | {pct(allh, 50):.2f} | {pct(allh, 50) - pct(allg, 50):+.2f} | "
      f"{pct(allg, 99):.2f} | {pct(allh, 99):.2f} | {pct(allh, 99) - pct(allg, 99):+.2f} | {pct(diffs, 50):+.2f} |")

if rd50:
    print(f"Mean over the rounds of HTTP - gRPC: p50 {sum(rd50) / len(rd50):+.2f} ms, p99 {sum(rd99) / len(rd99):+.2f} ms "
          "(each round's two paths minutes apart at most; the pooled row mixes the rounds' drift)")
print()
print("Inter-token latency of the background streams within the probes' window (ms)")
print("| path | streams ok | samples | ITL p50 | ITL p90 | ITL p99 | last stream end (s) |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
itl = {}
for label in ("bg_grpc", "bg_http"):
    qs = [q for q in lines(os.path.join(out, "bg_requests.jsonl")) if q["label"] == label]
    ok = [q for q in qs if q["ok"]]
    samples = []
    for q in ok:
        t = q["start_s"] + q["ttft_ms"] / 1e3
        for g in q["itl_us"]:
            t += g / 1e6
            if w0 <= t <= w1:
                samples.append(g / 1e3)
    itl[label] = samples
    end = max((q["start_s"] + q["e2el_ms"] / 1e3 for q in ok), default=float("nan"))
    first_end = min((q["start_s"] + q["e2el_ms"] / 1e3 for q in ok), default=float("nan"))
    print(f"| {label[3:]} | {len(ok)}/{len(qs)} | {len(samples)} | {pct(samples, 50):.3f} | {pct(samples, 90):.3f} | "
          f"{pct(samples, 99):.3f} | {end:.1f} (first {first_end:.1f}) |")
g, h = itl["bg_grpc"], itl["bg_http"]
if g and h:
    print(f"\nITL HTTP/gRPC: p50 {pct(h, 50) / pct(g, 50):.3f}, p99 {pct(h, 99) / pct(g, 99):.3f}; "
          f"probes' window ends at {w1:.1f} s (a background stream that ended before it left the load short)")
