#!/usr/bin/env bash
# Session 6, call 4: the CTA merge with its weights computed in parallel (tl3) against the one
# before (tl): kernel tests + memcheck, then decode_attention old / new / old, and the timeline.
set -u
source .devlibs-tl/env.sh
O=.devbuild/tl; N=.devbuild/tl3
step() { echo "=== $(date -u +%H:%M:%S) $*"; "$@"; echo "=== rc=$?"; }
step $N/kernels_paged_attention_test > $OUT/tests.log 2>&1; tail -3 $OUT/tests.log
step bash tests/kernels/run_memcheck.sh $N/kernels_paged_attention_test > $OUT/memcheck.log 2>&1; tail -3 $OUT/memcheck.log
A=(--schedules v2,kernel,wide_kernel --early kernel,wide_kernel --distances "" --replays 5)
for who in old new old2; do
  bin=$N; [[ $who == old* ]] && bin=$O
  step $bin/decode_attention "${A[@]}" --batches 1,8 --contexts 4096,16384,32768 --json $OUT/da_${who}_a.jsonl > $OUT/da_${who}_a.txt 2>&1
  step $bin/decode_attention "${A[@]}" --models llama-3-8b,qwen2.5-7b --batches 32,64 --contexts 1024,8192 --json $OUT/da_${who}_b.jsonl > $OUT/da_${who}_b.txt 2>&1
done
step $N/decode_timeline --models qwen2.5-7b,llama-3-8b,llama-2-7b --batches 1 --contexts 16384 --schedules auto,kernel --replays 2 --json $OUT/tl4.jsonl > $OUT/tl4.txt 2>&1
python3 - <<'PY'
import json,os
O=os.environ["OUT"]
def load(f):
    d={}
    for l in open(os.path.join(O,f)):
        j=json.loads(l)
        if j.get("impl")=="paged": d[(j["model"],j["batch"],j["ctx"],j["variant"])]=j["us"]
    return d
for part in "ab":
    old=load(f"da_old_{part}.jsonl"); new=load(f"da_new_{part}.jsonl"); old2=load(f"da_old2_{part}.jsonl")
    for k in sorted(new):
        if k in old and k in old2:
            print(*k, "old %.2f new %.2f old2 %.2f  new/old_mean speedup %.3f"%(old[k],new[k],old2[k],(old[k]+old2[k])/2/new[k]))
for l in open(os.path.join(O,"tl4.jsonl")):
    j=json.loads(l)
    if j["replay"]!=1: continue
    print(j["model"],j["schedule"],"call off/on %.2f/%.2f"%(j["us_call_timeline_off"],j["us_call_timeline_on"]),"merge p50",j["cta_merge"]["p50"],"weights",(j["cta_merge_weights"] or {}).get("p50"),"first",j["cta_first_data_after_wait"]["p50"],"units",j["cta_units_phase"]["p50"],
          "warpspread",j["cta_warp_end_spread"]["p50"],"written max",j["written"]["max"],"comb waited",(j["combine_waited"] or {}).get("p50"),"comb end",(j["combine_written"] or {}).get("max"),"waited p50",j["waited"]["p50"])
PY
cd $OUT && tar czf all.tgz *.jsonl *.txt *.log && rm -f *.jsonl *.txt *.log
