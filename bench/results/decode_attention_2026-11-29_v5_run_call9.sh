#!/usr/bin/env bash
# decode_attention v5, device call E (issue 4, session 6): the one-thread-per-dim combine
# (combine_dims 1, <= 32 splits) against the 32-dim-slice combine kernel, same process; tests
# and memcheck first. Run from the repository root on the GPU machine:
#   source .devlibs-s6/env.sh; bash .devbuild/c1/run.sh
set -uo pipefail
d=.devbuild/c1
out=${OUT:-/tmp/out}
w=$(mktemp -d)
trap 'tar -C "$w" -czf "$out/all.tgz" .' EXIT
"$d/kernels_paged_attention_args_test" > "$w/tests.log" 2>&1
"$d/kernels_paged_attention_test" >> "$w/tests.log" 2>&1
bash "$d/run_memcheck.sh" "$d/kernels_paged_attention_test" > "$w/memcheck.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|Failure|ERROR SUMMARY" "$w/tests.log" "$w/memcheck.log"
"$d/decode_attention" --batches 1,8 --contexts 1024,4096,8192,16384,32768 --schedules v2,kernel,wide_kernel \
  --early kernel,wide_kernel --combine1 kernel,wide_kernel --distances "" --replays 7 --json "$w/c1.jsonl" > "$w/c1.log" 2>&1
"$d/decode_attention" --models llama-3-8b,qwen2.5-7b --batches 32 --contexts 1024,4096 --schedules v2,kernel,wide_kernel \
  --early kernel,wide_kernel --combine1 kernel,wide_kernel --distances "" --replays 7 --json "$w/c1_b32.jsonl" > "$w/c1_b32.log" 2>&1
python3 - "$w/c1.jsonl" "$w/c1_b32.jsonl" <<'PY'
import json,sys,collections
d=collections.defaultdict(dict); cd={}
for f in sys.argv[1:]:
    for l in open(f):
        j=json.loads(l)
        if j.get("impl")=="paged":
            d[(j["model"],j["batch"],j["ctx"])][j["variant"]]=j["us"]; cd[(j["model"],j["batch"],j["ctx"],j["variant"])]=(j["splits"],j["combine_dims"])
for k,v in d.items():
    row=[]
    for s in ("kernel","kernel+early","wide_kernel","wide_kernel+early"):
        a=v.get(s+"_off"); b=v.get(s+"+c1_off") if "+early" not in s else v.get(s.replace("+early","+early+c1")+"_off")
        if a and b: row.append("%s %s %.3f"%(s, cd[k+(s.replace("+early","+early+c1") if "+early" in s else s+"+c1")+("_off",)] if False else cd.get(k+((s.replace("+early","+early+c1") if "+early" in s else s+"+c1")+"_off",)), a/b))
    print(*k, "auto %.2f us |"%v["auto"], " | ".join(row))
PY
