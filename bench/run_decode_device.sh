#!/usr/bin/env bash
# One GPU-machine sitting for the decode-attention kernel: GPU tests, memcheck, the benchmark and
# the PyTorch SDPA baseline, then the merged comparison. Everything lands in $OUT.
#   usage (on the GPU machine): bash run_decode_device.sh DIR_WITH_BINARIES_AND_SCRIPTS
set -uo pipefail
d=${1:?dir}
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv > "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
echo "== args test"; timeout 60 "$d/kernels_paged_attention_args_test" 2>&1 | tail -3
echo "== gpu tests"; timeout 150 "$d/kernels_paged_attention_test" > "$out/gpu_tests.log" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED) |FAILED|Failure|got .* want" "$out/gpu_tests.log" | head -20
echo "== memcheck"; timeout 120 bash "$d/run_memcheck.sh" "$d/kernels_paged_attention_test" > "$out/memcheck.log" 2>&1; echo "rc=$?"
tail -4 "$out/memcheck.log"
echo "== bench"; timeout ${BENCH_TIMEOUT:-200} "$d/decode_attention" --json "$out/paged.jsonl" ${BENCH_ARGS:-} > "$out/bench.log" 2>&1; echo "rc=$?"
echo "== sdpa"; PYTHONUNBUFFERED=1 timeout ${SDPA_TIMEOUT:-150} python3 "$d/sdpa_baseline.py" --json "$out/sdpa.jsonl" ${SDPA_ARGS:-} > "$out/sdpa.log" 2>&1; echo "rc=$?"
grep -v '^{' "$out/sdpa.log" | tail -5
python3 "$d/compare_decode.py" "$out/paged.jsonl" "$out/sdpa.jsonl" > "$out/compare.txt" 2>&1
sed -n '/^streaming read:/,$p' "$out/bench.log" | cut -c1-110
cat "$out/compare.txt"
