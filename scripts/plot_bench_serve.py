#!/usr/bin/env python3
"""Plots `kvstream bench serve --json-out` lines: latency against request rate (or against
concurrency when every run's rate is inf), one series per --label (e.g. one per server mode or
server), panels TTFT, TPOT, ITL and E2EL (median solid, the highest percentile recorded dashed)
and output token throughput. Needs matplotlib (Debian: python3-matplotlib, in
scripts/install-deps.sh).

    python3 scripts/plot_bench_serve.py RESULTS.jsonl [MORE.jsonl ...] [-o OUT.png]
"""
import argparse
import json
import math
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    d = json.loads(line)
                    if d.get("bench") == "serve":
                        rows.append(d)
    return rows


def x_of(row, by_rate):
    if by_rate:
        r = row["request_rate"]
        return math.inf if r == "inf" else float(r)
    return float(row["max_concurrency"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("jsonl", nargs="+")
    ap.add_argument("-o", "--out", default="bench_serve.png")
    a = ap.parse_args()
    rows = load(a.jsonl)
    if not rows:
        sys.exit("plot_bench_serve: no bench serve lines in " + ", ".join(a.jsonl))
    by_rate = any(r["request_rate"] != "inf" for r in rows)
    pcts = sorted({float(m.group(1).replace("_", ".")) for r in rows for k in r
                   for m in [re.match(r"p([0-9_]+)_ttft_ms$", k)] if m})
    top = pcts[-1] if pcts else None
    top_key = None if top is None else "p%s" % (("%g" % top).replace(".", "_"))
    series = {}
    for r in rows:
        name = r.get("label") or "%s %s" % (r.get("endpoint", ""), r.get("dataset", ""))
        series.setdefault(name, []).append(r)
    finite = [x_of(r, by_rate) for r in rows if math.isfinite(x_of(r, by_rate))]
    inf_at = (max(finite) * 1.5 if finite else 1.0)  # where "inf" is drawn

    panels = [("ttft", "TTFT (ms)"), ("tpot", "TPOT (ms)"), ("itl", "ITL (ms)"), ("e2el", "E2EL (ms)")]
    fig, axes = plt.subplots(1, 5, figsize=(22, 4.5))
    for i, (name, pts) in enumerate(sorted(series.items())):
        pts.sort(key=lambda r: x_of(r, by_rate))
        xs = [x_of(r, by_rate) for r in pts]
        xs = [x if math.isfinite(x) else inf_at for x in xs]
        color = "C%d" % (i % 10)
        for ax, (metric, title) in zip(axes, panels):
            ax.plot(xs, [r["median_%s_ms" % metric] for r in pts], "o-", color=color, label=name + " median")
            if top_key and all(top_key + "_%s_ms" % metric in r for r in pts):
                ax.plot(xs, [r[top_key + "_%s_ms" % metric] for r in pts], "s--", color=color,
                        label="%s p%g" % (name, top))
            ax.set_title(title)
        axes[4].plot(xs, [r["output_throughput"] for r in pts], "o-", color=color, label=name)
        axes[4].set_title("output tokens/s")
    for ax in axes:
        ax.set_xlabel("request rate (req/s)" if by_rate else "max concurrency")
        ax.grid(True, alpha=0.3)
        if by_rate and any(r["request_rate"] == "inf" for r in rows):
            ticks = sorted(set(finite)) + [inf_at]
            ax.set_xticks(ticks)
            ax.set_xticklabels(["%g" % t for t in ticks[:-1]] + ["inf"])
    axes[0].legend(fontsize=7)
    axes[4].legend(fontsize=7)
    fig.suptitle("kvstream bench serve: %s" % ", ".join(sorted({r["url"] for r in rows})))
    fig.tight_layout()
    fig.savefig(a.out, dpi=100)
    print("wrote " + a.out)


if __name__ == "__main__":
    main()
