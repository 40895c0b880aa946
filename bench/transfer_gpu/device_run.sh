#!/usr/bin/env bash
# One device sitting for the GPU transports: the GPU tests, then transfer_gpu per backend group.
#   usage (on the GPU machine, repo root): bash <dir>/device_run.sh <dir-with-binaries> <libs-dir>
# Logs and JSON lines go to $OUT (or ./out).
set -u
B=${1:-.devbuild/gputransport}
L=${2:-.devlibs-gputransport}
OUT=${OUT:-out}
mkdir -p "$OUT"
source "$L/env.sh"
export KVSTREAM_LOG_LEVEL=${KVSTREAM_LOG_LEVEL:-warn}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  nproc
  uname -r
} > "$OUT/machine.txt" 2>&1
"$B/transport_gpu_unit_test" > "$OUT/transport_gpu_unit_test.log" 2>&1
echo "rc=$?" >> "$OUT/transport_gpu_unit_test.log"
timeout 120 "$B/transport_gpu_test" > "$OUT/transport_gpu_test.log" 2>&1
echo "rc=$?" >> "$OUT/transport_gpu_test.log"
timeout 60 "$B/transfer_gpu" --backends=cuda_ipc,cuda_ipc_memcpy --json="$OUT/transfer_gpu.jsonl" \
  > "$OUT/transfer_gpu_ipc.log" 2>&1
echo "rc=$?" >> "$OUT/transfer_gpu_ipc.log"
timeout 60 "$B/transfer_gpu" --backends=ucx_host,ucx_staged --json="$OUT/transfer_gpu.jsonl" \
  > "$OUT/transfer_gpu_staged.log" 2>&1
echo "rc=$?" >> "$OUT/transfer_gpu_staged.log"
tail -n 4 "$OUT/transport_gpu_test.log"
grep -E "^(model|llama)" "$OUT/transfer_gpu_ipc.log" "$OUT/transfer_gpu_staged.log"
tail -n 3 "$OUT/transfer_gpu_staged.log"
