#!/usr/bin/env bash
# One GPU-machine sitting for the decode-attention kernel: GPU tests, memcheck, the benchmark and
# the PyTorch SDPA baseline, then the merged comparison. Everything lands in $OUT.
#   usage (on the GPU machine): bash run_decode_device.sh DIR_WITH_BINARIES_AND_SCRIPTS
set -uo pipefail
d=${1:?dir}
out=${OUT:-/tmp/out}
mkdir -p "$out"
# At most 8 files come back from $OUT: tests.log, bench.log, paged.jsonl, ncu.txt, sdpa.jsonl,
# sdpa.log, compare.txt (+ the caller's run.log).
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv > "$out/tests.log" 2>&1
cat "$out/tests.log"
echo "== args test"; timeout 60 "$d/kernels_paged_attention_args_test" 2>&1 | tail -3
echo "== gpu tests"; timeout 150 "$d/kernels_paged_attention_test" > /tmp/gpu_tests.log 2>&1; echo "rc=$?"
cat /tmp/gpu_tests.log >> "$out/tests.log"
grep -E "^\[  (PASSED|FAILED) |FAILED|Failure|got .* want" /tmp/gpu_tests.log | head -20
echo "== memcheck"; timeout 120 bash "$d/run_memcheck.sh" "$d/kernels_paged_attention_test" > /tmp/memcheck.log 2>&1; echo "rc=$?"
cat /tmp/memcheck.log >> "$out/tests.log"
tail -4 /tmp/memcheck.log
echo "== bench"; timeout ${BENCH_TIMEOUT:-200} "$d/decode_attention" --json "$out/paged.jsonl" ${BENCH_ARGS:-} > "$out/bench.log" 2>&1; echo "rc=$?"
echo "== ncu (DRAM bytes, prefetch off vs on, one shape)"
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [[ -n $ncu_bin ]]; then
  # The bench's first launches (one per kernel x prefetch variant, before timing) are profiled:
  # main and combine kernel of each, cold L2.
  timeout ${NCU_TIMEOUT:-90} "$ncu_bin" --clock-control none --cache-control all -k regex:'PagedDecode|CombineSplits' \
    --launch-count ${NCU_LAUNCHES:-8} \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_read_lookup_hit.sum,lts__t_sectors_op_read_lookup_miss.sum \
    "$d/decode_attention" ${NCU_BENCH_ARGS:---models llama-3-8b --batches 32 --contexts 8192 --replays 1} > "$out/ncu.txt" 2>&1
  echo "rc=$?"; grep -E "PagedDecode|CombineSplits|dram__|lts__|gpu__time" "$out/ncu.txt" | cut -c1-150
fi
if [[ ${RUN_SDPA:-1} == 1 ]]; then
echo "== sdpa"; PYTHONUNBUFFERED=1 timeout ${SDPA_TIMEOUT:-150} env -u LD_LIBRARY_PATH python3 "$d/sdpa_baseline.py" --json "$out/sdpa.jsonl" ${SDPA_ARGS:-} > "$out/sdpa.log" 2>&1; echo "rc=$?"
grep -v '^{' "$out/sdpa.log" | tail -5
fi
python3 "$d/compare_decode.py" "$out/paged.jsonl" $([[ -f $out/sdpa.jsonl ]] && echo "$out/sdpa.jsonl") > "$out/compare.txt" 2>&1
sed -n '/^streaming read:/,$p' "$out/bench.log" | cut -c1-110
cat "$out/compare.txt"
