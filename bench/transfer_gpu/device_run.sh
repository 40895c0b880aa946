#!/usr/bin/env bash
# One device sitting for the GPU transports (< 90 s, 3 files under $OUT):
#   tests.log           machine, transport_gpu_unit_test, transport_gpu_test
#   transfer_gpu.log    transfer_gpu stdout+stderr: cuda_ipc (+ memcpy/kernel modes), then
#                       ucx_host + ucx_staged, each with its table
#   transfer_gpu.jsonl  one JSON line per measurement
#   usage (on the GPU machine, repo root): bash <dir>/device_run.sh <dir-with-binaries> <libs-dir>
set -u
B=${1:-.devbuild/ipcperf}
L=${2:-.devlibs-ipcperf}
OUT=${OUT:-out}
mkdir -p "$OUT"
source "$L/env.sh"
export KVSTREAM_LOG_LEVEL=${KVSTREAM_LOG_LEVEL:-warn}
T0=$(date +%s)
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  echo "cpus $(nproc) kernel $(uname -r)"
  echo "== transport_gpu_unit_test"
  timeout 20 "$B/transport_gpu_unit_test" --gtest_brief=1 2>&1
  echo "rc=$?"
  echo "== transport_gpu_test"
  timeout 25 "$B/transport_gpu_test" 2>&1
  echo "rc=$?"
} > "$OUT/tests.log" 2>&1
{
  echo "== cuda_ipc (t=$(( $(date +%s) - T0 ))s)"
  timeout 30 "$B/transfer_gpu" --backends=cuda_ipc,cuda_ipc_memcpy,cuda_ipc_kernel --iters=20 \
    --json="$OUT/transfer_gpu.jsonl" 2>&1
  echo "rc=$?"
  echo "== ucx_host, ucx_staged (t=$(( $(date +%s) - T0 ))s)"
  timeout $(( 85 - ($(date +%s) - T0) )) "$B/transfer_gpu" --backends=ucx_host,ucx_staged --iters=8 \
    --json="$OUT/transfer_gpu.jsonl" 2>&1
  echo "rc=$?"
  echo "== done (t=$(( $(date +%s) - T0 ))s)"
} > "$OUT/transfer_gpu.log" 2>&1
grep -E "^\[  (PASSED|FAILED)|^rc=|FAILED " "$OUT/tests.log"
grep -E "^(== |llama|rc=)" "$OUT/transfer_gpu.log"
