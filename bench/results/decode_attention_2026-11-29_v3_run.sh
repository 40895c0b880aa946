#!/usr/bin/env bash
# The one device call of decode_attention v3 (issue 4, batch-1/8 fixed costs): GPU tests,
# memcheck, then the benchmark with every schedule side by side (v2 = the old path), all inside
# a total time budget. Run from the repository root on the GPU machine:
#   source .devlibs-kern3/env.sh; BUDGET=250 bash .devbuild/kern3/run.sh
# Binaries (stripped, Release, sm_90a) and this script in .devbuild/kern3/. Everything lands in
# $OUT/all.tgz.
set -uo pipefail
d=${BIN_DIR:-.devbuild/kern3}
out=${OUT:-/tmp/out}
w=$(mktemp -d)
T0=$SECONDS
BUDGET=${BUDGET:-250}
step() {  # step NAME TIMEOUT CMD... : runs CMD with min(TIMEOUT, what the budget has left)
  local name=$1 t=$2
  shift 2
  local left=$((BUDGET - (SECONDS - T0) - 8))
  ((t > left)) && t=$left
  if ((t < 5)); then
    echo "== $name: SKIPPED (total budget spent)"
    return
  fi
  echo "== $name (timeout ${t}s, at $((SECONDS - T0))s)"
  timeout "$t" "$@"
  echo "== $name rc=$? (at $((SECONDS - T0))s)"
}
pack() { tar -C "$w" -czf "$out/all.tgz" . ; }
trap pack EXIT

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
  step args 20 "$d/kernels_paged_attention_args_test"
} > "$w/tests.log" 2>&1
step gpu_tests 75 "$d/kernels_paged_attention_test" >> "$w/tests.log" 2>&1
step memcheck 70 bash "$d/run_memcheck.sh" "$d/kernels_paged_attention_test" > "$w/memcheck.log" 2>&1
grep -E "^== |^\[  (PASSED|FAILED) |FAILED|Failure|got .* want|ERROR SUMMARY|LEAK SUMMARY" "$w/tests.log" "$w/memcheck.log" | head -40

# A: the shapes, batch 1 and 8, in two processes (a fault in one schedule cannot lose
# the other half; v2 runs in both, which also shows the run-to-run spread):
# A1 = v2, kernel, wide_kernel (each also with the early L2 prefetch), kAuto and kAuto with the
# in-loop prefetch (lookahead 1);
# A2 = v2, fused, wide_fused, and both fused ones with the early L2 prefetch of 1, 2, 4 units.
step bench_a1 50 "$d/decode_attention" --batches 1,8 --contexts 1024,4096,8192,16384,32768 \
  --schedules v2,kernel,wide_kernel --early kernel,wide_kernel --replays 7 --json "$w/a1.jsonl" > "$w/a1.log" 2>&1
sed -n '/^streaming read:/,$p' "$w/a1.log"
step bench_a2 50 "$d/decode_attention" --batches 1,8 --contexts 1024,4096,8192,16384,32768 \
  --schedules v2,fused,wide_fused --early fused,wide_fused --early-units 1,2,4 --distances "" --replays 7 \
  --json "$w/a2.jsonl" > "$w/a2.log" 2>&1
sed -n '/^streaming read:/,$p' "$w/a2.log"
# B: the large-shape sweep (nothing may regress where B x ctx >= 64k was >= 0.95).
step bench_large 80 "$d/decode_attention" --batches 32,64,128 --schedules v2,kernel,fused \
  --early kernel,fused --distances "" --replays 5 --json "$w/large.jsonl" > "$w/large.log" 2>&1
sed -n '/^streaming read:/,$p' "$w/large.log"
# C: the same launches issued one by one (no graph), batch-1 GQA.
step bench_loop 25 "$d/decode_attention" --models llama-3-8b,qwen2.5-7b --batches 1 \
  --contexts 16384,32768 --schedules v2,kernel,fused,wide_fused --early fused,wide_fused \
  --distances "" --replays 5 --no-graph --json "$w/loop.jsonl" > "$w/loop.log" 2>&1
sed -n '/^streaming read:/,$p' "$w/loop.log"
echo "total $((SECONDS - T0))s"
