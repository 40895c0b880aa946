#!/usr/bin/env bash
# decode_attention v4, device call 2 (issue 4: cluster merge where one cluster holds all splits, 128-dim combine CTAs, early prefetch depth): GPU tests,
# memcheck, then the benchmark with the cluster schedules beside v2 and the v3 choices, and a
# same-size streaming read per shape. Run from the repository root on the GPU machine:
#   source .devlibs-kern5/env.sh; BUDGET=300 bash .devbuild/kern5/run2.sh
# Binaries (stripped, Release, sm_90a) and this script in .devbuild/kern5/. Everything lands in
# $OUT/all.tgz.
set -uo pipefail
d=${BIN_DIR:-.devbuild/kern5}
out=${OUT:-/tmp/out}
w=$(mktemp -d)
T0=$SECONDS
BUDGET=${BUDGET:-300}
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
step gpu_tests 90 "$d/kernels_paged_attention_test" >> "$w/tests.log" 2>&1
step memcheck 80 bash "$d/run_memcheck.sh" "$d/kernels_paged_attention_test" > "$w/memcheck.log" 2>&1
grep -E "^== |^\[  (PASSED|FAILED) |FAILED|Failure|got .* want|ERROR SUMMARY|LEAK SUMMARY|clusters of" "$w/tests.log" "$w/memcheck.log" | head -40

# A: batch 1 and 8, the contexts: v2, kernel, wide_kernel, wide_cluster, each (but v2)
# with the early L2 prefetch of 2 and 4 units, and kernel / wide_kernel with 128-dim combine CTAs.
step bench_a 120 "$d/decode_attention" --batches 1,8 --contexts 1024,4096,8192,16384,32768 \
  --schedules v2,kernel,wide_kernel,wide_cluster --early kernel,wide_kernel,wide_cluster --early-units 2,4 \
  --combine128 kernel,wide_kernel --distances "" --replays 7 --json "$w/a.jsonl" > "$w/a.log" 2>&1
sed -n '/^streaming read:/,$p' "$w/a.log"
# B: batch 32-128 (kAuto's classes above batch 8): v2, kernel, wide_kernel, wide_cluster, and
# kernel / wide_kernel with the early L2 prefetch.
step bench_b 120 "$d/decode_attention" --batches 32,64,128 --schedules v2,kernel,wide_kernel,wide_cluster \
  --early kernel,wide_kernel --distances "" --replays 5 --json "$w/b.jsonl" > "$w/b.log" 2>&1
sed -n '/^streaming read:/,$p' "$w/b.log"
echo "total $((SECONDS - T0))s"
