#!/usr/bin/env bash
# Session 6, call 1: per-CTA timelines of the decode kernel, and the paged-read ceiling.
set -u
source .devlibs-tl/env.sh
B=.devbuild/tl
step() { echo "=== $(date -u +%H:%M:%S) $*"; "$@"; echo "=== rc=$?"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
step $B/decode_timeline --models qwen2.5-7b,llama-3-8b,llama-2-7b --batches 1 --contexts 16384 \
  --schedules auto,kernel,v2 --replays 3 --json $OUT/tl_b1.jsonl > $OUT/tl_b1.txt 2>&1
step $B/decode_timeline --models qwen2.5-7b,llama-3-8b --batches 8 --contexts 16384 --schedules auto \
  --replays 3 --json $OUT/tl_b8.jsonl > $OUT/tl_b8.txt 2>&1
step $B/decode_attention --schedules v2 --early "" --distances "" --batches 1,8 --contexts 4096,16384,32768 \
  --replays 5 --json $OUT/gather_b1_8.jsonl > $OUT/gather_b1_8.txt 2>&1
tail -25 $OUT/gather_b1_8.txt
step $B/decode_attention --models llama-3-8b,qwen2.5-7b --schedules v2 --early "" --distances "" \
  --batches 32,64 --contexts 1024,4096,8192 --replays 5 --json $OUT/gather_b32_64.jsonl > $OUT/gather_b32_64.txt 2>&1
tail -16 $OUT/gather_b32_64.txt
step $B/decode_attention --models llama-3-8b,qwen2.5-7b --schedules v2 --early "" --distances "" \
  --batches 1,8 --contexts 16384 --tables sequential --replays 5 --json $OUT/seq_tables.jsonl > $OUT/seq_tables.txt 2>&1
tail -8 $OUT/seq_tables.txt
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv
python3 - <<'PY'
import json,os
for f in ("tl_b1.jsonl","tl_b8.jsonl"):
    p=os.path.join(os.environ["OUT"],f)
    if not os.path.exists(p): continue
    for l in open(p):
        j=json.loads(l)
        if j["replay"]!=1: continue
        print(j["model"],j["batch"],j["schedule"],"splits",j["splits"],"call us off/on %.2f/%.2f"%(j["us_call_timeline_off"],j["us_call_timeline_on"]),
              "step",j["globaltimer_step_ns"],"span %.2f"%j["last_call_span_us"])
        for k in ("entry","waited","first_data","all_done","written","combine_entry","combine_waited","combine_written","cta_first_data_after_wait","cta_units_phase","cta_merge","cta_warp_end_spread","sm_ghz"):
            print("  %-26s %s"%(k,j[k]))
        print("  active",j["active_ctas_per_500ns"])
PY
