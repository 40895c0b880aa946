#!/usr/bin/env python3
"""Derives the paged decode kernel's kAuto table from bench/decode_attention JSON lines.

For every class of kAuto's table - (MHA | GQA) x batch class (1 | 2-8 | 9-32 | > 32) x context
class (< 4k | < 8k | < 16k | longer) - and every candidate choice (a schedule, with or without
the early L2 prefetch of the default depth, variants with 128-dim combine CTAs excluded), it takes the choice
whose worst ratio to the fastest measured variant over the class's measured shapes is the
highest (minimax: no shape of the class loses much), and prints that worst ratio and the
choice's ratio to v2 (the old path) at each shape. A variant is compared only with variants of
the same process (the same shape line of the same file).

  python3 bench/auto_table.py a.jsonl b.jsonl ...
  EARLY_DEFAULT=2 python3 bench/auto_table.py ...   (files measured before v5)
"""
import collections
import json
import os
import sys

EARLY_DEFAULT = int(os.environ.get("EARLY_DEFAULT", "1"))


def bcls(b):
    return 0 if b <= 1 else 1 if b <= 8 else 2 if b <= 32 else 3


def ccls(c):
    return 0 if c < 4096 else 1 if c < 8192 else 2 if c < 16384 else 3


def main():
    # shape key (file, model, batch, ctx) -> {choice: gbps}
    shapes = collections.defaultdict(dict)
    gqa_of = {}
    for path in sys.argv[1:]:
        with open(path) as f:
            for line in f:
                if not line.startswith("{"):
                    continue
                r = json.loads(line)
                if r.get("impl") != "paged" or r.get("prefetch"):
                    continue
                v = r["variant"]
                if "+c128" in v:  # a non-default combine kernel
                    continue
                if v.startswith("auto") or "splits_x" in v:
                    continue
                name = v[:-4] if v.endswith("_off") else v
                # Default-depth early prefetch only ("+early", or "+early<depth>" with the
                # launcher's default depth, EARLY_DEFAULT: 1; 2 for measurements before v5).
                dflt = f"+early{EARLY_DEFAULT}"
                if "+early" in name and not (name.endswith("+early") or name.endswith(dflt)):
                    continue
                name = name.replace(dflt, "+early")
                key = (path, r["model"], r["batch"], r["ctx"])
                shapes[key][name] = r["gbps"]
                gqa_of[key] = r["heads"] != r["kv_heads"]
    classes = collections.defaultdict(list)
    for key, d in shapes.items():
        classes[(gqa_of[key], bcls(key[2]), ccls(key[3]))].append(key)
    names_b = ["1", "2-8", "9-32", ">32"]
    names_c = ["<4k", "<8k", "<16k", ">=16k"]
    for cls in sorted(classes):
        keys = classes[cls]
        cands = set.intersection(*[set(shapes[k]) for k in keys])
        best_choice, best_worst = None, -1.0
        for c in sorted(cands):
            worst = min(shapes[k][c] / max(shapes[k].values()) for k in keys)
            if worst > best_worst + 1e-9:
                best_choice, best_worst = c, worst
        vs_v2 = [shapes[k][best_choice] / shapes[k]["v2"] for k in keys if "v2" in shapes[k]]
        print(f"{'GQA' if cls[0] else 'MHA'} B{names_b[cls[1]]:>4} ctx{names_c[cls[2]]:>6}: "
              f"{best_choice:<20} worst vs fastest {best_worst:.3f}; vs v2 "
              f"{min(vs_v2):.3f}-{max(vs_v2):.3f} over {len(keys)} shapes")


if __name__ == "__main__":
    main()
