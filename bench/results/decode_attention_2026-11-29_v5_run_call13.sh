#!/usr/bin/env bash
# decode_attention v5, device call 13 (issue 4, session 6; branch spec, not merged): the first
# unit's KV loads issued on the length and block id read before the PDL wait (checked after it;
# a difference redoes the unit) against main (.devbuild/fin), old / new / old; tests first.
set -uo pipefail
N=.devbuild/spec; O=.devbuild/fin
out=${OUT:-/tmp/out}
w=$(mktemp -d)
trap 'tar -C "$w" -czf "$out/all.tgz" .' EXIT
"$N/kernels_paged_attention_test" > "$w/tests.log" 2>&1; grep -E "^\[  (PASSED|FAILED) |Failure" "$w/tests.log" | head -5
A=(--schedules v2,kernel,wide_kernel --early kernel,wide_kernel --distances "" --replays 5)
for who in old new old2; do
  bin=$N; [[ $who == old* ]] && bin=$O
  "$bin/decode_attention" "${A[@]}" --models llama-3-8b,qwen2.5-7b --batches 1,8,64 --contexts 4096,16384 --json "$w/da_$who.jsonl" > "$w/da_$who.log" 2>&1
done
python3 - "$w" <<'PY'
import json,sys,os
w=sys.argv[1]
def load(f):
    d={}
    for l in open(os.path.join(w,f)):
        j=json.loads(l)
        if j.get("impl")=="paged": d[(j["model"],j["batch"],j["ctx"],j["variant"])]=j["us"]
    return d
o,n,o2=load("da_old.jsonl"),load("da_new.jsonl"),load("da_old2.jsonl")
for k in sorted(n):
    if k[3] in ("auto","wide_kernel+early_off","kernel+early_off","wide_kernel_off"):
        print(*k,"speedup %.3f"%((o[k]+o2[k])/2/n[k]))
PY
