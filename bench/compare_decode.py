#!/usr/bin/env python3
"""Merges bench/decode_attention's JSON lines with bench/sdpa_baseline.py's (one device call):
prints our KV read rate / SDPA's per shape, the fractions of the streaming-read rate, the
prefetch gain per shape (MHA and GQA), and checks issue 4's targets.

  python3 bench/compare_decode.py paged.jsonl sdpa.jsonl
"""
import json
import sys


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    return rows


def main():
    paged = load(sys.argv[1])
    sdpa = load(sys.argv[2]) if len(sys.argv) > 2 else []
    streams = [r["gbps"] for r in paged if r.get("impl") == "stream_read"]
    stream = max(streams)
    summ = {(r["model"], r["batch"], r["ctx"]): r for r in paged if r.get("impl") == "paged_summary"}
    best = {(r["model"], r["batch"], r["ctx"]): r for r in sdpa if r.get("impl") == "sdpa_best"}
    print(f"streaming read (max of start/end in this run): {stream:.0f} GB/s "
          f"(all: {', '.join(f'{s:.0f}' for s in streams)})")
    observed = max([r["gbps"] for r in paged if r.get("impl") == "paged"] +
                   [r["gbps"] for r in sdpa if r.get("impl") == "sdpa_best"] + [stream])
    print(f"highest KV read rate seen in this run (any kernel): {observed:.0f} GB/s "
          f"= {observed / stream:.3f} x the streaming read; 'fmax' = ours / that; 'same' = ours / "
          f"the streaming read of exactly one call's bytes (same process, back to back); 'gath' = "
          f"ours / the paged read of exactly one call's tiles (GatherTilesRead, likewise)")
    hdr = (f"{'model':11} {'B':>4} {'ctx':>6} {'spl':>4} | {'ours GB/s':>9} {'frac':>6} | "
           f"{'fmax':>6} {'same':>6} {'gath':>6} | {'SDPA GB/s':>9} {'frac':>6} {'backend':>9} | {'ours/SDPA':>9} | "
           f"{'pf gain':>7} {'auto':>4} {'auto loss':>9}")
    print(hdr)
    print("-" * len(hdr))
    misses = {"T1 >=0.95 stream (B*ctx>=64k)": [], "T2 >=1.2x SDPA (B<=8, ctx>=4k)": [],
              "T3 >=0.8 stream (B<=8, ctx>=16k)": [], "T4 auto <=2% slower": []}
    counts = {k: 0 for k in misses}
    gains = {"MHA": [], "GQA": []}
    for key, r in summ.items():
        model, B, ctx = key
        ours = r["gbps_auto"]
        frac = ours / stream
        s = best.get(key)
        sg = s["gbps"] if s else float("nan")
        ratio = ours / sg if s else float("nan")
        kind = "MHA" if r["heads"] == r["kv_heads"] else "GQA"
        gains[kind].append((r["prefetch_gain"], key))
        print(f"{model:11} {B:4d} {ctx:6d} {r['splits']:4d} | {ours:9.0f} {frac:6.3f} "
              f"{ours / observed:6.3f} {ours / r.get('same_size_gbps', float('nan')):6.3f} "
              f"{ours / r.get('gather_gbps', float('nan')):6.3f} | "
              f"{sg:9.0f} {sg / stream:6.3f} {(s['backend'] if s else '-'):>9} | {ratio:9.3f} | "
              f"{r['prefetch_gain']:7.3f} {r['auto']:>4} {r['auto_slower_than_other'] * 100:8.1f}%")
        # What a read of the same bytes reaches, as a fraction of the streaming read: contiguous
        # (same-size) and through the same block tables (gather).
        ceil = (f"(same-size read {r.get('same_size_gbps', float('nan')) / stream:.3f}, "
                f"paged read {r.get('gather_gbps', float('nan')) / stream:.3f})")
        if B * ctx >= 65536:
            counts["T1 >=0.95 stream (B*ctx>=64k)"] += 1
            if frac < 0.95:
                misses["T1 >=0.95 stream (B*ctx>=64k)"].append(f"{model} B{B} ctx{ctx}: {frac:.3f} {ceil}")
        if B <= 8 and ctx >= 4096 and s:
            counts["T2 >=1.2x SDPA (B<=8, ctx>=4k)"] += 1
            if ratio < 1.2:
                misses["T2 >=1.2x SDPA (B<=8, ctx>=4k)"].append(f"{model} B{B} ctx{ctx}: {ratio:.3f}")
        if B <= 8 and ctx >= 16384:
            counts["T3 >=0.8 stream (B<=8, ctx>=16k)"] += 1
            if frac < 0.8:
                misses["T3 >=0.8 stream (B<=8, ctx>=16k)"].append(f"{model} B{B} ctx{ctx}: {frac:.3f} {ceil}")
        counts["T4 auto <=2% slower"] += 1
        if r["auto_slower_than_other"] > 0.02:
            misses["T4 auto <=2% slower"].append(
                f"{model} B{B} ctx{ctx}: {r['auto_slower_than_other'] * 100:.1f}%")
        if not (r.get("identical_outputs") and r.get("finite_outputs")):
            print(f"  !! outputs of the variants differ or are not finite at {key}")
    print()
    for kind, g in gains.items():
        if g:
            vals = sorted(x for x, _ in g)
            print(f"prefetch (distance 1) on/off speed ratio, {kind}: min {vals[0]:.3f}, "
                  f"median {vals[len(vals) // 2]:.3f}, max {vals[-1]:.3f} over {len(vals)} shapes")
    print()
    for k, m in misses.items():
        print(f"{k}: {counts[k] - len(m)}/{counts[k]} met" + ("" if not m else "; misses: " + "; ".join(m)))


if __name__ == "__main__":
    main()
