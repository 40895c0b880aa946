#!/usr/bin/env bash
# One device sitting (two GPUs: nvidia-h200-x2, under 4 minutes) for the host CPU cost of the GPU
# data paths: each process's CPU time (writer and receiver, all threads) over the measured
# iterations of every case, and over idle spans with an endpoint connected (see the CPU notes at
# the top of transfer_gpu.cc / transfer_nccl.cc). Everything lands in $TGZ (default
# $OUT/all.tgz) as cpucost/...:
#   machine.txt        GPUs, topology, CPUs
#   one.log/.jsonl     transfer_gpu, writer and receiver on GPU 0: cuda_ipc, ucx_staged (poll_us
#                      0 = busy wait, the default), ucx_staged:p20 and :p100 (poll every 20 / 100 us)
#   two.log/.jsonl     the same, writer GPU 0, receiver GPU 1
#   nccl.log/.jsonl    transfer_nccl GPU 0 -> GPU 1: nccl (tight polling, the default) and
#                      nccl_loose (tight_polling = false: 20 us sleeps)
#   summary.txt        per backend row: GB/s, writer / receiver cores, CPU us per write
# usage (GPU machine, repo root): bash .devbuild/cpucost/run.sh
#   knobs (env): B (binaries, default .devbuild/cpucost), L (libs, default .devlibs-cpucost),
#   ITERS, TOKENS, MODELS, GPU_BACKENDS, NCCL_BACKENDS, IDLE_MS, CPU_MS (shortest CPU span of a
#   case: its measured iterations go on until then), TGZ.
set -u
B=${B:-.devbuild/cpucost}
L=${L:-.devlibs-cpucost}
OUT=${OUT:-out}
TGZ=${TGZ:-$OUT/all.tgz}
ITERS=${ITERS:-10}
TOKENS=${TOKENS:-4096}
MODELS=${MODELS:-llama-3-8b}
GPU_BACKENDS=${GPU_BACKENDS:-cuda_ipc,ucx_staged,ucx_staged:p20,ucx_staged:p100}
NCCL_BACKENDS=${NCCL_BACKENDS:-nccl,nccl_loose}
IDLE_MS=${IDLE_MS:-200}
CPU_MS=${CPU_MS:-200}
R="$OUT/cpucost"
mkdir -p "$R"
source "$L/env.sh"
export NCCL_NVLS_ENABLE=0
export KVSTREAM_LOG_LEVEL=${KVSTREAM_LOG_LEVEL:-warn}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
# step NAME SECONDS CMD...: CMD under a timeout, output to $R/NAME.log, exit code last.
step() {
  local name=$1 limit=$2
  shift 2
  echo "== $name (timeout ${limit}s, t=$(el)s)" >> "$R/steps.log"
  timeout -k 5 "$limit" "$@" > "$R/$name.log" 2>&1
  echo "rc=$? (t=$(el)s)" | tee -a "$R/steps.log" >> "$R/$name.log"
}
{
  date -u
  nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id --format=csv
  nvidia-smi topo -m
  echo "cpus $(nproc) kernel $(uname -r)"
  grep -m1 "model name" /proc/cpuinfo
  echo "ITERS=$ITERS TOKENS=$TOKENS MODELS=$MODELS IDLE_MS=$IDLE_MS CPU_MS=$CPU_MS"
  echo "GPU_BACKENDS=$GPU_BACKENDS NCCL_BACKENDS=$NCCL_BACKENDS"
} > "$R/machine.txt" 2>&1
common=(--models="$MODELS" --tokens="$TOKENS" --iters="$ITERS" --idle-ms="$IDLE_MS" --cpu-ms="$CPU_MS")
step one 60 "$B/transfer_gpu" --device=0 --rx-device=0 --backends="$GPU_BACKENDS" "${common[@]}" \
  --json="$R/one.jsonl"
step two 60 "$B/transfer_gpu" --device=0 --rx-device=1 --backends="$GPU_BACKENDS" "${common[@]}" \
  --json="$R/two.jsonl"
step nccl 90 "$B/transfer_nccl" --writer-device=0 --receiver-device=1 --backends="$NCCL_BACKENDS" \
  "${common[@]}" --json="$R/nccl.jsonl"
echo "== done (t=$(el)s)" >> "$R/steps.log"
# Summary: the rows that carry CPU fields (backend rows and idle spans).
python3 - "$R" > "$R/summary.txt" 2>&1 <<'PY'
import json, os, sys
r = sys.argv[1]
print(f"{'run':4} {'backend':17} {'case':14} {'GB/s':>7} {'us':>9} {'W cores':>7} {'R cores':>7} {'W us/wr':>8} {'R us/wr':>8}")
for run in ("one", "two", "nccl"):
    p = os.path.join(r, run + ".jsonl")
    if not os.path.exists(p):
        print(f"{run}: no {run}.jsonl")
        continue
    for line in open(p):
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if "writer_cores" not in j:
            continue
        f = lambda k, w, d=2: (f"{j[k]:{w}.{d}f}" if k in j else f"{'-':>{w}}")
        if "median_us" in j:  # transfer_gpu (idle rows: the idle span)
            us = j["median_us"]
        elif j.get("gbps", 0) > 0:  # transfer_nccl: from bytes and GB/s
            us = j["bytes"] / j["gbps"] / 1e3
        else:  # transfer_nccl idle rows
            us = j.get("cpu_span_us", 0)
        print(f"{run:4} {j['backend'][:17]:17} {j['case'][:14]:14} {j.get('gbps', 0):7.1f} {us:9.1f} "
              f"{f('writer_cores', 7)} {f('receiver_cores', 7)} "
              f"{f('writer_cpu_us_per_write', 8, 1)} {f('receiver_cpu_us_per_write', 8, 1)}")
PY
tar -C "$OUT" -czf "$TGZ" cpucost && rm -rf "$R"  # (if killed before this, cpucost/* come back as is)
tar -xzOf "$TGZ" cpucost/steps.log
for f in one two nccl; do
  tar -xzOf "$TGZ" "cpucost/$f.log" 2>/dev/null | grep -iE "receiver failed|connect:|wait:|write:|notifications|usable|error|SKIP|rc=" | head -8
done
tar -xzOf "$TGZ" cpucost/summary.txt
