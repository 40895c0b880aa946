#!/usr/bin/env bash
# Where a batch-1 GQA call's time goes: ncu on the first launches of each kernel (main, combine,
# and the same-size streaming read), each alone, cold L2. Run from the repo root:
#   source .devlibs-kern5/env.sh; bash .devbuild/kern5/ncu.sh
set -uo pipefail
d=.devbuild/kern5
out=${OUT:-/tmp/out}/kern5; mkdir -p "$out"
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
echo "ncu: $ncu_bin"
for m in qwen2.5-7b llama-3-8b; do
  timeout 100 "$ncu_bin" --clock-control none --cache-control all -k regex:'PagedDecode|CombineSplits|StreamRead' \
    --launch-skip 12 --launch-count 8 \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__inst_executed.sum,launch__grid_size,launch__registers_per_thread \
    "$d/decode_attention" --models $m --batches 1 --contexts 16384 --schedules wide_kernel --early wide_kernel \
    --distances "" --replays 1 > "$out/ncu_$m.txt" 2>&1
  echo "$m rc=$?"
  grep -E "PagedDecode|CombineSplits|StreamRead|gpu__time|dram__|warps_active|long_scoreboard|grid_size" "$out/ncu_$m.txt" | cut -c1-160
done
