#!/usr/bin/env bash
# One two-GPU device sitting for the nccl transport; everything lands in $OUT/all.tgz (r/...):
#   tests.log          machine, GPU topology, nccl_wire_test, nccl_transport_gpu_test,
#                      daemons_gpu_test (both daemons on GPU 0, and prefill GPU 0 / decode GPU 1)
#   transfer.log       transfer_nccl stdout+stderr (nccl auto, nccl_loose = the first version's
#                      waits, cuda_ipc, cudaMemcpyPeer); transfer.jsonl one JSON line per row
#   ttft/              bench/run_ttft_gpu.sh's files (PART=ttft or all): prefill GPU 0, decode GPU 1
# usage (GPU machine, repo root): bash <dir>/nccl_device_run.sh <dir-with-binaries> <libs-dir>
# Knobs (env): PART (tests | ttft | all; default tests; all = tests, ttft, transfer),
#   SKIP_UNIT=1 (no nccl_wire_test / nccl_transport_gpu_test), GTEST_FILTER (daemons_gpu_test),
#   BACKENDS / MODELS_XFER / ITERS / XFER_TRACE=1 (transfer_nccl; the trace sets
#   KVSTREAM_NCCL_TRACE: one line per write and side), TEST_TIMEOUT, BENCH_TIMEOUT, and
#   run_ttft_gpu.sh's own (TRANSPORTS, MODELS, LENS_*, REQUESTS, STEP_TIMEOUT, TOTAL_BUDGET).
set -u
B=${1:-.devbuild/nccld}
L=${2:-.devlibs-nccld}
B=$(cd "$B" && pwd)
OUT=${OUT:-out}
PART=${PART:-tests}
mkdir -p "$OUT/r"
R="$OUT/r"
source "$L/env.sh"
export KVSTREAM_LOG_LEVEL=${KVSTREAM_LOG_LEVEL:-warn}
export NCCL_NVLS_ENABLE=0
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
T0=$(date +%s)
# step NAME SECONDS CMD...: a header with the time so far, CMD under a timeout, its exit code.
step() {
  local name=$1 limit=$2
  shift 2
  echo "== $name (t=$(( $(date +%s) - T0 ))s)"
  timeout -k 5 "$limit" "$@" 2>&1
  echo "rc=$?"
}
run_tests() {
  {
    date -u
    nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id --format=csv
    nvidia-smi topo -m
    echo "cpus $(nproc) kernel $(uname -r)"
    ls -l /usr/lib/x86_64-linux-gnu/libnccl.so* 2>&1 | head -3
    if [[ ${SKIP_UNIT:-0} != 1 ]]; then
      step nccl_wire_test 15 "$B/nccl_wire_test" --gtest_brief=1
      step nccl_transport_gpu_test 60 "$B/nccl_transport_gpu_test" --gtest_brief=1
    fi
    KVSTREAM_PREFILL_BIN="$B/kvstream-prefill" KVSTREAM_DECODE_BIN="$B/kvstream-decode" \
      step daemons_gpu_test "${TEST_TIMEOUT:-180}" "$B/daemons_gpu_test" --gtest_filter="${GTEST_FILTER:-*}"
    echo "== tests done (t=$(( $(date +%s) - T0 ))s)"
  } > "$R/tests.log" 2>&1
}
run_transfer() {
  KVSTREAM_NCCL_TRACE=${XFER_TRACE:-0} step transfer_nccl "${BENCH_TIMEOUT:-70}" "$B/transfer_nccl" \
    --iters=${ITERS:-6} --models=${MODELS_XFER:-llama-3-8b,llama-2-7b} \
    --backends=${BACKENDS:-cuda_ipc,nccl_loose,nccl} --json="$R/transfer.jsonl" > "$R/transfer.log" 2>&1
}
run_ttft() {
  mkdir -p "$R/ttft"
  OUT="$R/ttft" SKIP_TEST=1 PREFILL_DEVICE=0 DECODE_DEVICE=1 \
    TRANSPORTS=${TRANSPORTS:-"nccl cuda_ipc ucx_staged"} MODELS=${MODELS:-"llama-3-8b llama-2-7b"} \
    LENS_llama_3_8b=${LENS_llama_3_8b:-4096,16384} LENS_llama_2_7b=${LENS_llama_2_7b:-4096,16384} \
    EXTRA_MODEL_FLAGS=${EXTRA_MODEL_FLAGS:-"--max-position 32768"} REQUESTS=${REQUESTS:-2} \
    STEP_TIMEOUT=${STEP_TIMEOUT:-60} TOTAL_BUDGET=${TOTAL_BUDGET:-200} \
    bash "$B/run_ttft_gpu.sh" "$B" > "$R/ttft_run.log" 2>&1
}
case $PART in
  tests) run_tests; run_transfer ;;
  ttft) run_ttft ;;
  all) run_tests; run_ttft; run_transfer ;;
esac
tar -C "$OUT" -czf "$OUT/all.tgz" r && rm -rf "$R"  # (if killed before this, r/* come back as is)
if [[ $PART == tests || $PART == all ]]; then
  tar -xzOf "$OUT/all.tgz" r/tests.log | grep -E "^\[  (PASSED|FAILED|  SKIPPED)|^\[  FAILED|^\[       OK|^rc=|^== |SKIP|NCCL WARN|Failure|Expected|Which is|error" | head -80
  tar -xzOf "$OUT/all.tgz" r/transfer.log | grep -vE "^\{|^nccl trace" | tail -30
  tar -xzOf "$OUT/all.tgz" r/transfer.log | grep -E "^nccl trace" | head -12
fi
if [[ $PART == ttft || $PART == all ]]; then
  tar -xzOf "$OUT/all.tgz" r/ttft/summary.txt 2>/dev/null | tail -60
fi
echo "total $(( $(date +%s) - T0 ))s"
