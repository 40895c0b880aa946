#!/usr/bin/env bash
# One device sitting for the CUDA IPC transport (~60-90 s); everything lands in $OUT/all.tgz:
#   tests.log           machine, transport_gpu_unit_test, scatter_copy_gpu_test, transport_gpu_test
#   scatter_bench.log   scatter_bench: the scatter kernels alone vs cudaMemcpy D2D, host call costs
#   transfer_gpu.log    transfer_gpu stdout+stderr: cuda_ipc, cuda_ipc_memcpy, cuda_ipc_kernel
#                       (+ ucx_host, ucx_staged with UCX=1), each with its table
#   *.jsonl             one JSON line per measurement
# usage (GPU machine, repo root): bash <dir>/device_run.sh <dir-with-binaries> <libs-dir>
# env: UCX=1 adds the host-staged backends; KERNEL_VARIANTS="t512u4 ..." adds a cuda_ipc run per
# KVSTREAM_CUDA_IPC_KERNEL launch shape (llama-3-8b only); SCATTER_CONFIGS=a,b,.. the kernel
# shapes scatter_bench sweeps; LONG_TOKENS=16384 adds llama-3-8b at that prompt length.
set -u
B=${1:-.devbuild/ipc2}
L=${2:-.devlibs-ipc2}
OUT=${OUT:-out}
mkdir -p "$OUT/r"
R="$OUT/r"
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
  echo "== scatter_copy_gpu_test"
  timeout 60 "$B/scatter_copy_gpu_test" --gtest_brief=1 2>&1
  echo "rc=$?"
  echo "== transport_gpu_test"
  timeout 40 "$B/transport_gpu_test" 2>&1
  echo "rc=$?"
  echo "== tests done (t=$(( $(date +%s) - T0 ))s)"
} > "$R/tests.log" 2>&1
{
  timeout 60 "$B/scatter_bench" --iters=15 --json="$R/scatter_bench.jsonl" \
    ${SCATTER_CONFIGS:+--configs=$SCATTER_CONFIGS} 2>&1
  echo "rc=$?"
  echo "== scatter_bench done (t=$(( $(date +%s) - T0 ))s)"
} > "$R/scatter_bench.log" 2>&1
{
  echo "== cuda_ipc (t=$(( $(date +%s) - T0 ))s)"
  timeout 60 "$B/transfer_gpu" --backends=cuda_ipc,cuda_ipc_memcpy,cuda_ipc_kernel --iters=20 \
    --json="$R/transfer_gpu.jsonl" 2>&1
  echo "rc=$?"
  for k in ${KERNEL_VARIANTS:-}; do
    echo "== cuda_ipc KVSTREAM_CUDA_IPC_KERNEL=$k (t=$(( $(date +%s) - T0 ))s)"
    KVSTREAM_CUDA_IPC_KERNEL=$k timeout 30 "$B/transfer_gpu" --backends=cuda_ipc,cuda_ipc_kernel \
      --models=llama-3-8b --iters=20 --json="$R/transfer_gpu_variant_$k.jsonl" 2>&1
    echo "rc=$?"
  done
  if [ -n "${LONG_TOKENS:-}" ]; then  # llama-3-8b with more blocks per layer (several launches)
    echo "== cuda_ipc, llama-3-8b at $LONG_TOKENS tokens (t=$(( $(date +%s) - T0 ))s)"
    timeout 60 "$B/transfer_gpu" --backends=cuda_ipc,cuda_ipc_memcpy --models=llama-3-8b \
      --tokens="$LONG_TOKENS" --iters=10 --json="$R/transfer_gpu_${LONG_TOKENS}.jsonl" 2>&1
    echo "rc=$?"
  fi
  if [ "${UCX:-0}" = 1 ]; then
    echo "== ucx_host, ucx_staged (t=$(( $(date +%s) - T0 ))s)"
    timeout 60 "$B/transfer_gpu" --backends=ucx_host,ucx_staged --iters=8 \
      --json="$R/transfer_gpu.jsonl" 2>&1
    echo "rc=$?"
  fi
  echo "== done (t=$(( $(date +%s) - T0 ))s)"
} > "$R/transfer_gpu.log" 2>&1
tar -C "$OUT" -czf "$OUT/all.tgz" r && rm -rf "$R"
tar -xzOf "$OUT/all.tgz" r/tests.log | grep -E "^\[  (PASSED|FAILED)|^rc=|FAILED |^== |SKIP"
tar -xzOf "$OUT/all.tgz" r/scatter_bench.log | grep -E "^(llama|rc=|== )| us$|^  " | head -150
tar -xzOf "$OUT/all.tgz" r/transfer_gpu.log | grep -E "^(== |llama|rc=)"
