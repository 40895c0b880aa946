#!/usr/bin/env bash
# One two-GPU device sitting for the nccl transport (~60-150 s); everything lands in $OUT/all.tgz:
#   tests.log          machine, GPU topology, nccl_wire_test, nccl_transport_gpu_test
#   transfer.log       transfer_nccl stdout+stderr (nccl auto/pack/direct, cuda_ipc, cudaMemcpyPeer)
#   transfer.jsonl     one JSON line per measurement (transfer_chunk16.jsonl: nccl_pack, 16 MiB chunks)
# usage (GPU machine, repo root): bash <dir>/nccl_device_run.sh <dir-with-binaries> <libs-dir>
set -u
B=${1:-.devbuild/nccl}
L=${2:-.devlibs-nccl}
OUT=${OUT:-out}
mkdir -p "$OUT/r"
R="$OUT/r"
source "$L/env.sh"
export KVSTREAM_LOG_LEVEL=${KVSTREAM_LOG_LEVEL:-warn}
export NCCL_NVLS_ENABLE=0
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
T0=$(date +%s)
{
  date -u
  nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id --format=csv
  nvidia-smi topo -m
  echo "cpus $(nproc) kernel $(uname -r)"
  ls -l /usr/lib/x86_64-linux-gnu/libnccl.so* /usr/local/cuda/lib64/libnccl.so* 2>&1 | head
  echo "== nccl_wire_test"
  timeout 15 "$B/nccl_wire_test" --gtest_brief=1 2>&1
  echo "rc=$?"
  echo "== nccl_transport_gpu_test"
  timeout ${TEST_TIMEOUT:-60} "$B/nccl_transport_gpu_test" 2>&1
  echo "rc=$?"
  echo "== tests done (t=$(( $(date +%s) - T0 ))s)"
} > "$R/tests.log" 2>&1
{
  echo "== transfer_nccl (t=$(( $(date +%s) - T0 ))s)"
  timeout ${BENCH_TIMEOUT:-80} "$B/transfer_nccl" --iters=${ITERS:-8} --json="$R/transfer.jsonl" 2>&1
  echo "rc=$?"
  echo "== transfer_nccl nccl_pack, 16 MiB chunks (t=$(( $(date +%s) - T0 ))s)"
  timeout ${BENCH2_TIMEOUT:-25} "$B/transfer_nccl" --backends=nccl_pack --chunk-mb=16 --iters=${ITERS:-8} \
    --json="$R/transfer_chunk16.jsonl" 2>&1
  echo "rc=$?"
  echo "== done (t=$(( $(date +%s) - T0 ))s)"
} > "$R/transfer.log" 2>&1
tar -C "$OUT" -czf "$OUT/all.tgz" r && rm -rf "$R"  # (if killed before this, r/* come back as is)
tar -xzOf "$OUT/all.tgz" r/tests.log | grep -E "^\[  (PASSED|FAILED|  SKIPPED)|^\[       OK|^rc=|FAILED|^== |SKIP|took|surfaced|after close|GPU\(s\)|NCCL WARN" | head -60
tar -xzOf "$OUT/all.tgz" r/transfer.log | grep -vE "^\{" | tail -45
