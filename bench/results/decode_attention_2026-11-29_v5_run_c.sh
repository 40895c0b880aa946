#!/usr/bin/env bash
# decode_attention v5, device call C (issue 4, session 6): the early L2 prefetch's depth (1-4
# units per warp) at batch 1-8 GQA, where the timelines show the next call's CTAs waiting
# 5-11 us for the previous call's tail. Run from the repository root on the GPU machine:
#   source .devlibs-s6/env.sh; bash .devbuild/s6/run_c.sh
set -uo pipefail
d=.devbuild/s6
out=${OUT:-/tmp/out}
"$d/decode_attention" --models llama-3-8b,qwen2.5-7b --batches 1,8 --contexts 4096,16384,32768 \
  --schedules v2,wide_kernel,wide_cluster --early wide_kernel,wide_cluster --early-units 1,2,3,4 \
  --distances "" --replays 7 --json "$out/early_units.jsonl" > "$out/early_units.log" 2>&1
sed -n '/^streaming read:/,$p' "$out/early_units.log"
python3 - "$out/early_units.jsonl" <<'PY'
import json,sys,collections
d=collections.defaultdict(dict)
for l in open(sys.argv[1]):
    j=json.loads(l)
    if j.get("impl")=="paged": d[(j["model"],j["batch"],j["ctx"])][j["variant"]]=j["us"]
for k,v in d.items():
    for s in ("wide_kernel","wide_cluster"):
        base=v.get(s+"_off")
        if base is None: continue
        print(*k, s, "off %.2f"%base, " ".join("e%d %.3f"%(u, base/v[f"{s}+early{u}_off"]) for u in (1,2,3,4) if f"{s}+early{u}_off" in v))
PY
