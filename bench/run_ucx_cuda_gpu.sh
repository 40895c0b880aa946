#!/usr/bin/env bash
# ucx_perftest between two processes on loopback with CUDA and host memory, for a UCX built by
# scripts/install-deps.sh --ucx-cuda (docs/transports.md, "A CUDA-enabled UCX"). Run on the GPU
# machine, with the UCX install (bin/ucx_info, bin/ucx_perftest, lib/, lib/ucx/) carried:
#
#   bench/run_ucx_cuda_gpu.sh UCX_DIR OUT_DIR [SIZE_BYTES] [ITERS] [PUT_ITERS]
#
# Matrix: memory host|cuda x test tag_bw|ucp_put_bw x UCX_TLS tcp,cuda_copy (tcp on lo: the
# network path; UCX stages CUDA memory through host buffers itself) | default (all transports:
# shared memory, cuda_ipc on one host) x protocols v1 (1.13's default) | v2 (UCX_PROTO_ENABLE=y).
# Writes OUT_DIR/ucx_info.txt, OUT_DIR/perftest.log (every run's full output) and prints a table.
set -uo pipefail
ucx=$(cd "${1:?usage: run_ucx_cuda_gpu.sh UCX_DIR OUT_DIR [SIZE] [ITERS]}" && pwd)
out=${2:?OUT_DIR}
size=${3:-16777216}
iters=${4:-100}
put_iters=${5:-16}   # UCX 1.13's put over TCP flushes slowly (seconds at 16 MiB): fewer of them
mkdir -p "$out"
export LD_LIBRARY_PATH="$ucx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULE_DIR="$ucx/lib/ucx"
info=$out/ucx_info.txt
log=$out/perftest.log
{
  echo "## date: $(date -u +%FT%TZ)  host: $(hostname)  $(nproc) cores"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  echo "## ucx_info -v"; "$ucx/bin/ucx_info" -v 2>&1
  echo "## ucx_info -d (transports and devices)"
  "$ucx/bin/ucx_info" -d 2>&1 | grep -E '^#( +)?(Transport|Device|Memory domain|Component)|memory types' 
  echo "## ldd libuct_cuda.so"; ldd "$ucx/lib/ucx/libuct_cuda.so.0" 2>&1
} > "$info"
cat "$info"

port=13400
row() {  # row MEM TEST TLS PROTO
  local mem=$1 test=$2 tls=$3 proto=$4 env=() line n=$iters
  [[ $test == ucp_put_bw ]] && n=$put_iters
  [[ $tls != default ]] && env+=(UCX_TLS="$tls" UCX_NET_DEVICES=lo)
  [[ $proto == v2 ]] && env+=(UCX_PROTO_ENABLE=y)
  port=$((port + 1))
  {
    echo "### mem=$mem test=$test tls=$tls proto=$proto size=$size iters=$n"
    echo "\$ env ${env[*]} ucx_perftest -p $port &   # server"
    echo "\$ env ${env[*]} ucx_perftest 127.0.0.1 -p $port -t $test -m $mem -s $size -n $n -w 4"
  } >> "$log"
  env "${env[@]}" timeout 30 "$ucx/bin/ucx_perftest" -p $port >> "$log.server" 2>&1 &
  local srv=$!
  sleep 0.5
  line=$(env "${env[@]}" timeout 25 "$ucx/bin/ucx_perftest" 127.0.0.1 -p $port -t "$test" -m "$mem" \
           -s "$size" -n "$n" -w 4 2>&1 | tee -a "$log" | grep -E '^Final:' | tail -1)
  wait "$srv" 2>/dev/null
  # Final: iters, typical lat, avg lat, overall lat, avg bw (MB/s), overall bw (MB/s), msgrate
  if [[ -n $line ]]; then
    printf '| %-4s | %-10s | %-13s | %-2s | %10s |\n' "$mem" "$test" "$tls" "$proto" \
      "$(awk '{print $7}' <<<"$line")"
  else
    printf '| %-4s | %-10s | %-13s | %-2s | %10s |\n' "$mem" "$test" "$tls" "$proto" "failed or >25 s"
  fi
}

table=$out/table.md
{
  echo "| mem  | test       | UCX_TLS       | pr | MB/s (overall) |"
  echo "| ---- | ---------- | ------------- | -- | ---------- |"
  for proto in v1 v2; do
    for tls in tcp,cuda_copy default; do
      for mem in cuda host; do
        for test in tag_bw ucp_put_bw; do
          row "$mem" "$test" "$tls" "$proto"
        done
      done
    done
  done
} | tee "$table"
cat "$log.server" >> "$log"; rm -f "$log.server"

# Which transports and protocols UCX chose for CUDA memory over tcp,cuda_copy (v1: the
# endpoint's lanes at UCX_LOG_LEVEL=info; v2: UCX_PROTO_INFO=y).
sel=$out/selection.txt
for proto in v1 v2; do
  env=(UCX_TLS=tcp,cuda_copy UCX_NET_DEVICES=lo)
  if [[ $proto == v2 ]]; then env+=(UCX_PROTO_ENABLE=y UCX_PROTO_INFO=y); else env+=(UCX_LOG_LEVEL=info); fi
  port=$((port + 1))
  echo "### $proto: env ${env[*]} ucx_perftest 127.0.0.1 -t tag_bw -m cuda -s $size -n 4" >> "$sel"
  env "${env[@]}" timeout 30 "$ucx/bin/ucx_perftest" -p $port > "$sel.server" 2>&1 &
  srv=$!
  sleep 0.5
  env "${env[@]}" timeout 25 "$ucx/bin/ucx_perftest" 127.0.0.1 -p $port -t tag_bw -m cuda \
    -s "$size" -n 4 -w 1 >> "$sel" 2>&1
  wait "$srv" 2>/dev/null
  { echo "#### server"; cat "$sel.server"; } >> "$sel"; rm -f "$sel.server"
done
grep -iE 'tag\(|rndv|cuda_copy|tcp/' "$sel" | sort | uniq -c | sort -rn | head -20
