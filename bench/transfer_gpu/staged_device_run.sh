#!/usr/bin/env bash
# One device sitting for the host-staged path ("ucx_staged", issue 5), within BUDGET seconds.
# STEPS picks what runs, in this order (default "tests one two"):
#   tests   transport_gpu_test, staged parts (zero-copy with doorbells, forced put, 1 MiB
#           chunks, "plain" = the paths before doorbells / kernel overlap / per-write chunk
#           sizes; killed-writer slot reclaim)                                -> tests.log
#   one     transfer_gpu, writer and receiver on GPU 0: pinned H2D / D2H / both at once, then
#           ucx_staged (defaults) beside variants with one change each undone and the previous
#           defaults all undone ($ONE_BACKENDS)                               -> one.log, one.jsonl
#   two     the same with the writer on GPU 1 and the receiver on GPU 0 (each its own PCIe
#           link; baselines: H2D on GPU 0, D2H on GPU 1) ($TWO_BACKENDS)      -> two.log, two.jsonl
#   rtt     ucx_notify_rtt (a UCX notification's round trip)                  -> rtt.jsonl
#   daemons daemons_gpu_test, ucx_staged cases (both daemons on GPU 0, tokens == colocated;
#           needs kvstream-prefill / kvstream-decode in the bin dir)       -> tests.log
#   ttft    bench/run_ttft_gpu.sh at 4096 tokens over ucx_staged and cuda_ipc (needs the
#           daemons and run_ttft_gpu.sh in the bin dir)                       -> ttft/
# Everything lands in $OUT/all.tgz; a short table is printed last.
# usage (GPU machine, repo root): OUT=... bash staged_device_run.sh <bin-dir> <libs-dir>
# Bundle the libraries of the binaries only: bundle-libs.sh stops at a non-binary (e.g. this
# script copied among them) before it writes env.sh; on 2026-11-29 17:18 that left the bundled
# libraries off the library path and daemons_gpu_test could not load libgrpc++.
set -u
B=$(cd "${1:?bin dir}" && pwd)
L=${2:?libs dir}
OUT=${OUT:-out}
BUDGET=${BUDGET:-120}
STEPS=${STEPS:-"tests one two"}
ITERS=${ITERS:-8}
ONE_BACKENDS=${ONE_BACKENDS:-ucx_staged,ucx_staged:a0:s0:p20:d0,ucx_staged:d0,ucx_staged:s0,ucx_staged:a0,ucx_staged:p20,ucx_staged:a128,ucx_staged:a1024}
TWO_BACKENDS=${TWO_BACKENDS:-ucx_staged,ucx_staged:a0:s0:p20:d0,ucx_staged:d0,ucx_staged:a0}
R="$OUT/r"
mkdir -p "$R"
source "$L/env.sh"
export NCCL_NVLS_ENABLE=0
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
# cap WANT RESERVE: a step's timeout, at most WANT, leaving RESERVE seconds for what follows.
cap() {
  local l=$(( BUDGET - $(el) - $2 ))
  (( l > $1 )) && l=$1
  (( l < 5 )) && l=5
  echo "$l"
}
has() { [[ " $STEPS " == *" $1 "* ]]; }
{
  date -u
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id --format=csv
  nvidia-smi topo -m 2>/dev/null | head -8
  echo "cpus $(nproc) kernel $(uname -r)"
  echo "STEPS=$STEPS ITERS=$ITERS"
  echo "ONE_BACKENDS=$ONE_BACKENDS"
  echo "TWO_BACKENDS=$TWO_BACKENDS"
} > "$R/machine.txt" 2>&1

export KVSTREAM_LOG_LEVEL=info
if has tests; then
  {
    echo "== transport_gpu_test (staged) t=$(el)"
    KVSTREAM_EXPECT_ZERO_COPY=1 timeout -k 3 "$(cap 60 60)" "$B/transport_gpu_test" \
      --gtest_filter='*ucx_staged*:*Staged*' 2>&1
    echo "rc=$?"
  } > "$R/tests.log" 2>&1
fi
export KVSTREAM_LOG_LEVEL=warn
if has rtt; then
  KVSTREAM_LOG_LEVEL=warn timeout 15 "$B/ucx_notify_rtt" --iters=3000 > "$R/rtt.jsonl" 2>&1
fi
if has one; then
  {
    echo "== transfer_gpu, one GPU t=$(el)"
    timeout -k 3 "$(cap 60 30)" "$B/transfer_gpu" --device=0 --rx-device=0 --backends="$ONE_BACKENDS" \
      --iters="$ITERS" --json="$R/one.jsonl" 2>&1
    echo "rc=$?"
  } > "$R/one.log" 2>&1
fi
if has two; then
  {
    echo "== transfer_gpu, writer GPU 1, receiver GPU 0 t=$(el)"
    timeout -k 3 "$(cap 45 5)" "$B/transfer_gpu" --device=1 --rx-device=0 --backends="$TWO_BACKENDS" \
      --iters="$ITERS" --json="$R/two.jsonl" 2>&1
    echo "rc=$?"
  } > "$R/two.log" 2>&1
fi
# The daemons log at their default level: daemons_gpu_test looks for an info line of theirs.
unset KVSTREAM_LOG_LEVEL
if has daemons; then
  {
    echo "== daemons_gpu_test (ucx_staged) t=$(el)"
    KVSTREAM_PREFILL_BIN="$B/kvstream-prefill" KVSTREAM_DECODE_BIN="$B/kvstream-decode" \
      timeout -k 3 "$(cap 45 5)" "$B/daemons_gpu_test" --gtest_filter='*ucx_staged*' 2>&1
    echo "rc=$?"
  } >> "$R/tests.log" 2>&1
fi
if has ttft; then
  OUT="$R/ttft" SKIP_TEST=1 MODELS="llama-2-7b llama-3-8b" TRANSPORTS="ucx_staged cuda_ipc" \
    LENS_llama_2_7b=4096 LENS_llama_3_8b=4096 EXTRA_MODEL_FLAGS="--max-position 32768" REQUESTS=2 \
    STEP_TIMEOUT=45 TOTAL_BUDGET=$(( BUDGET - $(el) - 5 )) bash "$B/run_ttft_gpu.sh" "$B" > "$R/ttft.log" 2>&1
fi
echo "== done t=$(el)" >> "$R/machine.txt"
tar -C "$OUT" -czf "$OUT/all.tgz" r && rm -rf "$R"
tar -xzOf "$OUT/all.tgz" r/tests.log 2>/dev/null | grep -E "^\[  (PASSED|FAILED)|^rc=|FAILED |^== |connected|path"
for f in one two; do
  tar -xzOf "$OUT/all.tgz" "r/$f.log" 2>/dev/null | grep -E "^(llama|rc=|== )" | cut -c1-150
done
tar -xzOf "$OUT/all.tgz" r/machine.txt | tail -1
tar -xzOf "$OUT/all.tgz" r/ttft/summary.txt 2>/dev/null | tail -20
