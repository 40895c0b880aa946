#!/usr/bin/env bash
# gpu_landed_wait on the GPU machine, one sitting: the landed-flag GPU tests, the cuda_ipc
# transport tests, the daemons' GPU test with gpu_landed_wait on, then (only if those passed and
# time is left) pipelined TTFT with gpu_landed_wait off and on (bench/run_ttft_gpu.sh,
# llama-3-8b, cuda_ipc, one GPU).
#
#   usage (repo root of the GPU machine): bash bench/run_landed_wait_gpu.sh [BIN_DIR]
#   BIN_DIR holds landed_event_gpu_test, transport_gpu_test, daemons_gpu_test, kvstream,
#   kvstream-prefill, kvstream-decode. Output: $OUT/all.tgz (r/: one log per step).
#   BUDGET: wall seconds for the whole script (default 160). TTFT_BUDGET: seconds per TTFT
#   pair (default: half of what is left for "off", the rest for "on"). SKIP_DAEMONS=1 /
#   SKIP_TRANSPORT=1 leave out those tests (when they already passed with these binaries);
#   TTFT_LENS (default 4096,16384), TTFT_REQUESTS (default 2).
set -u
export NCCL_NVLS_ENABLE=0
B=$(cd "${1:-.devbuild/ipcflag}" && pwd)
OUT=${OUT:-out}
R=$OUT/r
mkdir -p "$R"
T0=$SECONDS
BUDGET=${BUDGET:-160}
left() { echo $(( BUDGET - (SECONDS - T0) )); }
declare -A RC
run() {  # name timeout cmd...
  local n=$1 t=$2; shift 2
  local l=$(( $(left) - 5 ))
  (( t > l )) && t=$l
  if (( t < 5 )); then echo "== $n SKIPPED (budget)"; RC[$n]=skip; return; fi
  echo "== $n (timeout $t s, at $((SECONDS - T0)) s)"
  timeout -k 5 "$t" "$@" > "$R/$n.log" 2>&1
  RC[$n]=$?
  echo "== $n rc=${RC[$n]} ($((SECONDS - T0)) s)"
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]|Failure|SKIPPED|^RESULT" "$R/$n.log" | head -30
}
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv; } > "$R/machine.txt" 2>&1
cat "$R/machine.txt"
export KVSTREAM_PREFILL_BIN=$B/kvstream-prefill KVSTREAM_DECODE_BIN=$B/kvstream-decode
run landed_event_gpu_test 60 "$B/landed_event_gpu_test"
RC[transport_gpu_test]=skip RC[daemons_gpu_test]=skip
[[ ${SKIP_TRANSPORT:-0} == 1 ]] || run transport_gpu_test 45 "$B/transport_gpu_test" --gtest_filter='*cuda_ipc*'
[[ ${SKIP_DAEMONS:-0} == 1 ]] || run daemons_gpu_test 60 "$B/daemons_gpu_test" --gtest_filter='*GpuLandedWait*:*TinyTokensEqualColocatedOnGpu*'
if [[ ${RC[landed_event_gpu_test]} == 0 && ${RC[daemons_gpu_test]} != [1-9]* && $(left) -gt 60 ]]; then
  for mode in off on; do
    budget=$(( $(left) - 5 ))
    [[ $mode == off ]] && budget=$(( budget / 2 ))
    [[ -n ${TTFT_BUDGET:-} ]] && budget=$(( TTFT_BUDGET < $(left) - 5 ? TTFT_BUDGET : $(left) - 5 ))
    flags=""
    [[ $mode == on ]] && flags="--gpu_landed_wait=true"
    echo "== ttft gpu_landed_wait=$mode (budget $budget s, at $((SECONDS - T0)) s)"
    mkdir -p "$R/ttft_$mode"
    OUT=$R/ttft_$mode SKIP_TEST=1 MODELS=llama-3-8b TRANSPORTS=cuda_ipc \
      REQUESTS=${TTFT_REQUESTS:-2} WARMUP=1 LENS_llama_3_8b=${TTFT_LENS:-4096,16384} \
      EXTRA_MODEL_FLAGS="--max-position 32768" \
      EXTRA_DECODE_FLAGS="$flags" TOTAL_BUDGET=$budget STEP_TIMEOUT=$budget \
      bash bench/run_ttft_gpu.sh "$B" > "$R/ttft_$mode.log" 2>&1
    tail -12 "$R/ttft_$mode/summary.txt" 2>/dev/null
  done
else
  echo "== ttft skipped (tests rc: landed ${RC[landed_event_gpu_test]}, daemons ${RC[daemons_gpu_test]}; $(left) s left)"
fi
echo "total $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz r
