#!/usr/bin/env bash
# decode_attention v4, device call 1 (issue 4: cluster merge of the split partials): GPU tests,
# memcheck, then the benchmark with the cluster schedules beside v2 and the v3 choices, and a
# same-size streaming read per shape. Run from the repository root on the GPU machine:
#   source .devlibs-kern5/env.sh; BUDGET=300 bash .devbuild/kern5/run1.sh
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

# A: batch 1 and 8, the contexts: v2, the v3 choices (wide_kernel, kernel, each with
# the early L2 prefetch) and the cluster schedules (with and without it).
step bench_a 90 "$d/decode_attention" --batches 1,8 --contexts 1024,4096,8192,16384,32768 \
  --schedules v2,kernel,wide_kernel,cluster,wide_cluster --early kernel,wide_kernel,cluster,wide_cluster \
  --distances "" --replays 7 --json "$w/a.jsonl" > "$w/a.log" 2>&1
sed -n '/^streaming read:/,$p' "$w/a.log"
# B: the GQA batch-32/64 shapes that missed 0.95 (v3), and whether a cluster merge changes them.
step bench_b 60 "$d/decode_attention" --models llama-3-8b,qwen2.5-7b --batches 32,64 \
  --contexts 1024,4096,8192 --schedules v2,kernel,cluster,wide_cluster --early "" --distances "" \
  --replays 5 --json "$w/b.jsonl" > "$w/b.log" 2>&1
sed -n '/^streaming read:/,$p' "$w/b.log"
echo "total $((SECONDS - T0))s"
