#!/usr/bin/env bash
# Session 6, call 2: timelines of every schedule at batch-1 GQA; ncu warp stalls and per-SASS
# stall samples of the 16-warp kernel (qwen2.5-7b B1 ctx 16k).
set -u
source .devlibs-tl/env.sh
B=.devbuild/tl
step() { echo "=== $(date -u +%H:%M:%S) $*"; "$@"; echo "=== rc=$?"; }
step $B/decode_timeline --models qwen2.5-7b,llama-3-8b --batches 1 --contexts 16384 \
  --schedules wide_kernel,wide_fused,wide_cluster,kernel,fused,cluster --replays 2 --json $OUT/tl2_b1.jsonl > $OUT/tl2_b1.txt 2>&1
N="ncu --kernel-name regex:PagedDecodeKernel --launch-skip 1 --launch-count 1"
step $N --section WarpStateStats --section SourceCounters --section SpeedOfLight --section LaunchStats \
  --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio -o $OUT/wide_q16k \
  $B/decode_attention --models qwen2.5-7b --batches 1 --contexts 16384 --schedules wide_kernel --early "" \
  --distances "" --replays 1 > $OUT/ncu_run.txt 2>&1
step ncu -i $OUT/wide_q16k.ncu-rep --page details --print-details all > $OUT/ncu_details.txt 2>&1
step ncu -i $OUT/wide_q16k.ncu-rep --page source --csv --print-source sass > $OUT/ncu_sass.csv 2>&1
ls -la $OUT
grep -E "stalled_.*ratio" $OUT/ncu_details.txt | sort -k3 -n -r | head -30
python3 - <<'PY'
import json,os
p=os.path.join(os.environ["OUT"],"tl2_b1.jsonl")
for l in open(p):
    j=json.loads(l)
    if j["replay"]!=1: continue
    g=lambda k,q="p50": (j[k] or {}).get(q) if j[k] else None
    print(j["model"],j["schedule"],"splits",j["splits"],"cl",j["cluster"],"call %.2f"%j["us_call_timeline_off"],"waited",g("waited"),"first",g("first_data"),
          "done",g("all_done"),"written p50/max",g("written"),g("written","max"),"merged p50/max",g("merged"),g("merged","max"),
          "comb_wait",g("combine_waited"),"comb_end",g("combine_written","max"),"span %.2f"%j["last_call_span_us"])
PY
