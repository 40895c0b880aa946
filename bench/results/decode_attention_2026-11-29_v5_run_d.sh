#!/usr/bin/env bash
# decode_attention v5, device call D (issue 4, session 6: the final measurement of what is on
# main): GPU tests and memcheck, the whole sweep with kAuto as a caller gets it beside v2 and
# kAuto with the in-loop prefetch (lookahead 1) and the same-size and paged-read ceilings, the
# per-CTA timelines of batch-1/8 calls (the timeline build), PyTorch SDPA on the same shapes in
# the same call, and the comparison. Run from the repository root on the GPU machine:
#   source .devlibs-s6/env.sh; BUDGET=560 bash .devbuild/s6/run_d.sh
# Binaries (stripped, Release, sm_90a), sdpa_baseline.py, compare_decode.py and this script in
# .devbuild/s6/. Everything lands in $OUT/all.tgz.
set -uo pipefail
d=${BIN_DIR:-.devbuild/s6}
out=${OUT:-/tmp/out}
w=$(mktemp -d)
T0=$SECONDS
BUDGET=${BUDGET:-560}
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

# The sweep: every issue shape, v2 (the old path), kAuto (what a caller gets) and kAuto with the
# paper's in-loop prefetch (lookahead 1): the prefetch gain per shape.
step bench 200 "$d/decode_attention" --schedules v2 --distances 1 --replays 5 --json "$w/paged.jsonl" > "$w/paged.log" 2>&1
sed -n '/^streaming read:/,$p' "$w/paged.log"
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >> "$w/tests.log"
# Where a call's time goes, per CTA (the timeline build of the same kernels).
step timeline 60 "$d/decode_timeline" --models qwen2.5-7b,llama-3-8b,llama-2-7b --batches 1,8 --contexts 16384 \
  --schedules auto --replays 3 --json "$w/timeline.jsonl" > "$w/timeline.log" 2>&1
# PyTorch SDPA (the fastest backend per shape) on the same shapes, contiguous KV.
PYTHONUNBUFFERED=1 step sdpa 230 env -u LD_LIBRARY_PATH python3 "$d/sdpa_baseline.py" --json "$w/sdpa.jsonl" > "$w/sdpa.log" 2>&1
grep -v '^{' "$w/sdpa.log" | tail -5
python3 "$d/compare_decode.py" "$w/paged.jsonl" "$w/sdpa.jsonl" > "$w/compare.txt" 2>&1
cat "$w/compare.txt"
echo "total $((SECONDS - T0))s"
# The early prefetch's depth where call C did not measure it: MHA batch 1, GQA batch 32 at 4k.
"$d/decode_attention" --models llama-2-7b --batches 1 --contexts 4096,16384,32768 --schedules v2,wide_kernel \
  --early wide_kernel --early-units 1,2 --distances "" --replays 7 --json "$out/early_mha.jsonl" > "$out/early_mha.log" 2>&1
"$d/decode_attention" --models llama-3-8b,qwen2.5-7b --batches 32 --contexts 4096 --schedules v2,wide_kernel \
  --early wide_kernel --early-units 1,2 --distances "" --replays 7 --json "$out/early_b32.jsonl" > "$out/early_b32.log" 2>&1
sed -n '/^model/,$p' "$out/early_mha.log" "$out/early_b32.log"
