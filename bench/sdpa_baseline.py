#!/usr/bin/env python3
"""PyTorch scaled_dot_product_attention decode baseline for bench/decode_attention.

Same shapes, same KV bytes, same rotation rule (>= 320 MiB of KV sets cycled), same JSON line
format as the paged benchmark, but with contiguous KV ([batch, kv_heads, ctx, head_dim]) as a
PyTorch user would hold it. Every SDPA backend that accepts the shape is timed (GQA through
enable_gqa=True); the fastest is reported as "sdpa_best". Timing: a CUDA graph of launches
cycling through the sets, replayed several times; median replay time / launches (CUDA events).

  python3 bench/sdpa_baseline.py --json sdpa.jsonl [--mem-cap-gib 72] [--quick]
"""
import argparse
import contextlib
import json
import math
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

MODELS = [("llama-2-7b", 32, 32), ("llama-3-8b", 32, 8), ("qwen2.5-7b", 28, 4)]
HEAD_DIM = 128
MIN_ROTATED = 320 * (1 << 20)
BACKENDS = [
    ("cudnn", [SDPBackend.CUDNN_ATTENTION]),
    ("flash", [SDPBackend.FLASH_ATTENTION]),
    ("efficient", [SDPBackend.EFFICIENT_ATTENTION]),
    ("default", None),  # PyTorch's own pick (may be one of the above, or math)
]


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def time_backend(backends, q, ks, vs, launches, replays, gqa):
    """Returns (median us per call, graph used) or raises if the backend refuses the shape."""
    n_sets = len(ks)
    kw = {"enable_gqa": True} if gqa else {}
    ctx = sdpa_kernel(backends) if backends else contextlib.nullcontext()
    with ctx:
        # Eager first: raises here when the backend cannot run the shape.
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for i in range(3):
                F.scaled_dot_product_attention(q, ks[i % n_sets], vs[i % n_sets], **kw)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        use_graph = True
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for i in range(launches):
                    F.scaled_dot_product_attention(q, ks[i % n_sets], vs[i % n_sets], **kw)
            run = g.replay
        except Exception as e:  # noqa: BLE001 - fall back to eager timing
            print(f"graph capture refused ({e}); eager loop", file=sys.stderr)
            use_graph = False

            def run():
                for i in range(launches):
                    F.scaled_dot_product_attention(q, ks[i % n_sets], vs[i % n_sets], **kw)
        run()
        torch.cuda.synchronize()
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        us = []
        for _ in range(replays):
            a.record()
            run()
            b.record()
            b.synchronize()
            us.append(a.elapsed_time(b) * 1e3 / launches)
        if use_graph:
            del g
        return median(us), use_graph


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    ap.add_argument("--mem-cap-gib", type=float, default=72)
    ap.add_argument("--batches", default="1,8,32,64,128")
    ap.add_argument("--contexts", default="1024,4096,8192,16384,32768")
    ap.add_argument("--models", default="")
    ap.add_argument("--replays", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    batches = [int(x) for x in args.batches.split(",")]
    contexts = [int(x) for x in args.contexts.split(",")]
    if args.quick:
        batches, contexts, args.replays = [1, 32], [4096, 16384], 3
    models = [m for m in MODELS if not args.models or m[0] in args.models]
    out = open(args.json, "w") if args.json else None

    def emit(d):
        line = json.dumps(d)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    dev = torch.cuda.get_device_properties(0)
    emit({"bench": "decode_attention", "impl": "sdpa_device", "gpu": dev.name,
          "torch": torch.__version__, "cudnn": torch.backends.cudnn.version()})
    cap = args.mem_cap_gib * (1 << 30)
    D = HEAD_DIM
    for name, H, Hkv in models:
        for B in batches:
            for ctx in contexts:
                set_bytes = B * ctx * Hkv * D * 2 * 2
                n_sets = max(2, math.ceil(MIN_ROTATED / set_bytes))
                if set_bytes * n_sets > cap and set_bytes >= MIN_ROTATED:
                    n_sets = 1
                base = {"bench": "decode_attention", "impl": "sdpa", "model": name, "heads": H,
                        "kv_heads": Hkv, "head_dim": D, "dtype": "f16", "batch": B, "ctx": ctx}
                if set_bytes * n_sets > cap:
                    emit({**base, "impl": "skip", "reason": f"over --mem-cap-gib {args.mem_cap_gib}"})
                    continue
                gen = torch.Generator(device="cuda").manual_seed(B * 7919 + ctx + Hkv)
                ks = [torch.empty(B, Hkv, ctx, D, device="cuda", dtype=torch.float16).uniform_(-1, 1, generator=gen)
                      for _ in range(n_sets)]
                vs = [torch.empty(B, Hkv, ctx, D, device="cuda", dtype=torch.float16).uniform_(-1, 1, generator=gen)
                      for _ in range(n_sets)]
                q = torch.empty(B, H, 1, D, device="cuda", dtype=torch.float16).uniform_(-1, 1, generator=gen)
                min_launches = int(min(max((4 << 30) / set_bytes, 4), 24))
                launches = n_sets * max(1, -(-min_launches // n_sets))
                kv_bytes = float(set_bytes)
                best = None
                for bname, blist in BACKENDS:
                    try:
                        us, graph = time_backend(blist, q, ks, vs, launches, args.replays, Hkv != H)
                    except Exception as e:  # noqa: BLE001 - the backend refuses this shape
                        emit({**base, "backend": bname, "error": str(e).splitlines()[0][:200]})
                        torch.cuda.synchronize()
                        continue
                    gbps = kv_bytes / (us * 1e-6) / 1e9
                    rec = {**base, "backend": bname, "us": us, "kv_bytes": kv_bytes, "gbps": gbps,
                           "n_sets": n_sets, "rotated_mib": set_bytes * n_sets / (1 << 20),
                           "launches_per_graph": launches, "graph": graph}
                    emit(rec)
                    if best is None or us < best["us"]:
                        best = rec
                if best is not None:
                    emit({**best, "impl": "sdpa_best"})
                del ks, vs, q
                torch.cuda.empty_cache()
    if out:
        out.close()


if __name__ == "__main__":
    main()
