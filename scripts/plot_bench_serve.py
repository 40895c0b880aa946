#!/usr/bin/env python3
"""Plots `kvstream bench serve --json-out` lines: latency against request rate (or against
concurrency when every run's rate is inf), one series per --label (e.g. one per server mode or
server), panels TTFT, TPOT, ITL and E2EL (median solid, the highest percentile recorded dashed)
and output token throughput. Runs that differ only by label (e.g. one per server configuration, at
one rate and concurrency) are drawn as bars instead: TTFT median and highest percentile, of
first and later turns for a multi-turn dataset, and output token throughput. Needs matplotlib (Debian: python3-matplotlib, in
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


def bars(rows, top_key, out):
    """One group of bars per run (label), in the order of the file."""
    multiturn = all("median_ttft_later_turns_ms" in r for r in rows)
    kinds = (["ttft_first_turn", "ttft_later_turns"] if multiturn else ["ttft"])
    names = [r.get("label") or str(i) for i, r in enumerate(rows)]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / (2 * len(kinds))
    j = 0
    for kind in kinds:
        for stat in ["median", top_key]:
            key = "%s_%s_ms" % (stat, kind)
            if stat is None or not all(key in r for r in rows):
                continue
            xs = [i + (j - len(kinds)) * width + width / 2 for i in range(len(rows))]
            bs = axes[0].bar(xs, [r[key] for r in rows], width, label="%s %s" % (kind.replace("_", " "), stat))
            axes[0].bar_label(bs, fmt="%.0f", fontsize=7)
            j += 1
    axes[0].set_xticks(range(len(rows)))
    axes[0].set_xticklabels(names)
    axes[0].set_ylabel("ms")
    axes[0].set_title("TTFT")
    axes[0].legend(fontsize=8)
    bs = axes[1].bar(range(len(rows)), [r["output_throughput"] for r in rows], color="C7")
    axes[1].bar_label(bs, fmt="%.0f", fontsize=7)
    axes[1].set_xticks(range(len(rows)))
    axes[1].set_xticklabels(names)
    axes[1].set_title("output tokens/s")
    for ax in axes:
        ax.grid(True, axis="y", alpha=0.3)
    r0 = rows[0]
    fig.suptitle("kvstream bench serve: %s, rate %s, max concurrency %s" %
                 (r0.get("dataset", ""), r0["request_rate"], r0["max_concurrency"]))
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print("wrote " + out)


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
    if len({(r["request_rate"], r["max_concurrency"]) for r in rows}) == 1 and len(rows) > 1:
        return bars(rows, top_key, a.out)
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
