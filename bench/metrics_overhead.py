#!/usr/bin/env python3
"""Summary of bench/run.sh metrics: the metrics endpoint on against off.

  metrics_overhead.py TTFT_JSONL TPUT_JSONL
  metrics_overhead.py --scrape PORT[,PORT...]   (GET /metrics of each port every 0.5 s, forever)

TTFT_JSONL: auth_overhead's lines (modes off, off2, on; p50 ratio against off, 95% CI).
TPUT_JSONL: `kvstream bench itl` phase lines labelled metrics=off|off2|on, one per pair per
round. Prints each pair's tokens/s (median, min, max over rounds) and the per-round ratios
on/off and off2/off (median and range): off2/off is the noise floor of two identical pairs.
"""
import json
import statistics
import sys
import time
import urllib.request


def lines(path):
    out = []
    for l in open(path):
        l = l.strip()
        if l.startswith("{"):
            out.append(json.loads(l))
    return out


def scrape_forever(ports):
    while True:
        for p in ports:
            urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=5).read()
        time.sleep(0.5)


def main():
    if sys.argv[1] == "--scrape":
        scrape_forever([p for p in sys.argv[2].split(",") if p])
        return
    ttft = [j for j in lines(sys.argv[1]) if j.get("bench") == "auth_overhead"]
    print("TTFT (auth_overhead, requests one at a time, pairs interleaved round by round):")
    for j in ttft:
        lo, hi = j["ratio_ci95"]
        print(f"  {j['mode']:5s} p50 {j['ttft_p50_ms']:.3f} ms  p90 {j['ttft_p90_ms']:.3f} ms  "
              f"p50/off {j['p50_ratio_vs_off']:.4f} (95% CI {lo:.4f}-{hi:.4f})  "
              f"same tokens: {j['same_tokens']}")
    rows = [j for j in lines(sys.argv[2]) if j.get("kind") == "itl_phase"]
    by = {}
    for i, j in enumerate(rows):
        mode = j["label"].split("=", 1)[1]
        by.setdefault(mode, []).append(j["tokens_per_s"])
    print("decode tokens/s at %s streams (one run per pair per round, order rotated):" %
          (rows[0]["streams"] if rows else "?"))
    for mode in ("off", "off2", "on"):
        v = by.get(mode, [])
        if v:
            print(f"  {mode:5s} median {statistics.median(v):.1f}  min {min(v):.1f}  "
                  f"max {max(v):.1f}  ({len(v)} rounds)")
    summary = {"bench": "metrics_overhead", "ttft": {j["mode"]: j for j in ttft}}
    for mode in ("on", "off2"):
        pairs = list(zip(by.get(mode, []), by.get("off", [])))
        if not pairs:
            continue
        ratios = [a / b for a, b in pairs]
        print(f"  {mode}/off per round: median {statistics.median(ratios):.4f}  "
              f"range {min(ratios):.4f}-{max(ratios):.4f}")
        summary[f"tokens_per_s_{mode}_over_off"] = {
            "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    summary["tokens_per_s"] = {m: statistics.median(v) for m, v in by.items()}
    print(json.dumps(summary, default=str)[:2000])


if __name__ == "__main__":
    main()
