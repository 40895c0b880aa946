#!/usr/bin/env python3
"""Checks numpy_reference.py against real transformers goldens.

    python3 scripts/goldens/compare_reference.py DIR [DIR...]

Each DIR is a case folder (config.json, safetensors, golden.json) written by
make_model_goldens.py --reference transformers. numpy_reference.py runs the same checkpoint and
prompt in float32; the script prints, per case, whether its greedy tokens equal transformers'
float32-run tokens (tokens_f32), the largest |difference| of the first step's logits
(logits_first_f32) absolute and relative to the largest |logit|, and the same for inv_freq and
attention_scaling. Exit status 1 when any case's tokens differ.
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_reference as nr  # noqa: E402


def compare(d):
    with open(os.path.join(d, "golden.json")) as f:
        g = json.load(f)
    with open(os.path.join(d, "config.json")) as f:
        conf = json.load(f)
    w = nr.read_checkpoint(d)
    tokens, _, first, _ = nr.greedy(conf, w, g["prompt"], len(g["tokens_f32"]))
    ref = np.asarray(g["logits_first_f32"], dtype=np.float64)
    diff = float(np.max(np.abs(np.asarray(first, dtype=np.float64) - ref)))
    rot = nr.Rotary(conf)
    inv = float(np.max(np.abs(rot.inv_freq.astype(np.float64) - np.asarray(g["inv_freq"]))))
    return {
        "case": g["case"],
        "tokens_equal": tokens == g["tokens_f32"],
        "tokens_equal_native": tokens == g["tokens"],
        "logit_max_abs_diff": diff,
        "logit_rel_diff": diff / float(np.max(np.abs(ref))),
        "inv_freq_max_abs_diff": inv,
        "attention_scaling_diff": abs(rot.scaling - g["attention_scaling"]),
        "versions": g.get("versions"),
    }


def main():
    worst, bad = 0.0, []
    for d in sys.argv[1:]:
        r = compare(d)
        print(json.dumps(r), flush=True)
        worst = max(worst, r["logit_rel_diff"])
        if not r["tokens_equal"]:
            bad.append(r["case"])
    print("cases %d, tokens differ: %s, worst first-step logit difference %.3g of max |logit|"
          % (len(sys.argv) - 1, bad or "none", worst))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
