#!/usr/bin/env bash
# decode_attention v5, device call A (issue 4, session 6: the CTA merge computing its weights
# once; kAuto's table to re-derive): GPU tests, memcheck, then every schedule with and without
# the early L2 prefetch on the shapes, with the same-size and paged-read ceilings.
# Run from the repository root on the GPU machine:
#   source .devlibs-s6/env.sh; BUDGET=540 bash .devbuild/s6/run_a.sh
# Binaries (stripped, Release, sm_90a) and this script in .devbuild/s6/. Everything lands in
# $OUT/all.tgz.
set -uo pipefail
d=${BIN_DIR:-.devbuild/s6}
out=${OUT:-/tmp/out}
w=$(mktemp -d)
T0=$SECONDS
BUDGET=${BUDGET:-540}
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
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used,temperature.gpu,power.draw --format=csv
  step args 20 "$d/kernels_paged_attention_args_test"
} > "$w/tests.log" 2>&1
step gpu_tests 90 "$d/kernels_paged_attention_test" >> "$w/tests.log" 2>&1
step memcheck 80 bash "$d/run_memcheck.sh" "$d/kernels_paged_attention_test" > "$w/memcheck.log" 2>&1
grep -E "^== |^\[  (PASSED|FAILED) |FAILED|Failure|got .* want|ERROR SUMMARY|LEAK SUMMARY" "$w/tests.log" "$w/memcheck.log" | head -40

# A: batch 1 and 8: v2, kernel, wide_kernel, wide_cluster, each (but v2) also with the early
# L2 prefetch (default depth).
step bench_a 170 "$d/decode_attention" --batches 1,8 --contexts 1024,4096,8192,16384,32768 \
  --schedules v2,kernel,wide_kernel,wide_cluster --early kernel,wide_kernel,wide_cluster \
  --distances "" --replays 7 --json "$w/a.jsonl" > "$w/a.log" 2>&1
sed -n '/^streaming read:/,$p' "$w/a.log"
# B: batch 32-128: v2, kernel, wide_kernel, wide_cluster, and kernel / wide_kernel with the
# early L2 prefetch.
step bench_b 170 "$d/decode_attention" --batches 32,64,128 --schedules v2,kernel,wide_kernel,wide_cluster \
  --early kernel,wide_kernel --distances "" --replays 5 --json "$w/b.jsonl" > "$w/b.log" 2>&1
sed -n '/^streaming read:/,$p' "$w/b.log"
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
echo "total $((SECONDS - T0))s"
