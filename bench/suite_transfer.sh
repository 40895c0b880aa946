# shellcheck shell=bash
# bench/run.sh's transfer suite (sourced): the transport benches, each beside its copy ceiling in
# the same run. Steps (the two-GPU ones where two GPUs are found):
#   scatter_bench        the scatter-copy kernels alone vs cudaMemcpy D2D, host call costs
#   transfer_gpu ipc     cuda_ipc and its variants between two processes on GPU 0, vs D2D
#   transfer_gpu long    the same at LONG_TOKENS (several launches per layer)
#   transfer_gpu staged  ucx_host, ucx_staged and its variants (one change undone each), vs pinned
#                        H2D / D2H
#   transfer_gpu two     the staged path with writer and receiver on two GPUs (own PCIe links)
#   transfer_nccl        nccl (auto, loose polling, pack, direct) and cuda_ipc peer copies across two
#                        GPUs, vs cudaMemcpyPeer
#   cpu cost (CPU_COST=1) each process's CPU time per write and while idle (--idle-ms/--cpu-ms):
#                        transfer_gpu on one and two GPUs, transfer_nccl; subject cpu_cost
#   ucx_notify_rtt       a UCX notification's round trip (the staged path's per-chunk control)
#   transport_bw         the UCX backend's Write() bandwidth vs ucx_perftest (host memory, no GPU)
# Knobs: IPC_BACKENDS, LONG_TOKENS (16384; 0: off), STAGED_BACKENDS, TWO_BACKENDS, TWO_WRITER (1),
# TWO_RECEIVER (0), NCCL_BACKENDS, NCCL_MODELS, CHUNK_MB (nccl staging chunk), SCATTER_CONFIGS,
# LONG_BLOCKS, ITERS (per bench; defaults 20 ipc / 8 staged / 6 nccl), MODELS (transfer_gpu's),
# CPU_COST=1 (with IDLE_MS 200, CPU_MS 200, CPU_BACKENDS, CPU_NCCL_BACKENDS), BW_TLS ("sm,tcp tcp").
# Other environment variables pass through as KEY=VALUE; label such a run with --tag. (The GPU
# backends read none: their switches are options, e.g. transfer_nccl --trace.)
suite_transfer() {
  local smoke=${SMOKE:-0} j n
  n=$(ngpus)
  local ipc=${IPC_BACKENDS:-cuda_ipc,cuda_ipc_memcpy,cuda_ipc_kernel,cuda_ipc_packed,cuda_ipc_early}
  local staged=${STAGED_BACKENDS:-ucx_host,ucx_staged,ucx_staged:a0:p20,ucx_staged:a0,ucx_staged:p20,ucx_staged:a128,ucx_staged:a1024}
  local two=${TWO_BACKENDS:-ucx_staged,ucx_staged:a0:p20,ucx_staged:a0}
  local nccl=${NCCL_BACKENDS:-cuda_ipc,nccl,nccl_pack,nccl_direct}
  local models=${MODELS:-llama-3-8b,llama-2-7b} long=${LONG_TOKENS:-16384}
  local it_ipc=${ITERS:-20} it_staged=${ITERS:-8} it_nccl=${ITERS:-6} it_scatter=${ITERS:-15}
  local sc=(${SCATTER_CONFIGS:+--configs="$SCATTER_CONFIGS"} ${LONG_BLOCKS:+--long-blocks="$LONG_BLOCKS"})
  if [[ $smoke == 1 ]]; then
    ipc=cuda_ipc,cuda_ipc_memcpy staged=ucx_staged two=ucx_staged nccl=cuda_ipc,nccl models=llama-3-8b long=0
    it_ipc=5 it_staged=3 it_nccl=3 it_scatter=3 sc=(--configs=t256u8)
  fi
  if have scatter_bench; then
    j=$(jtmp scatter_bench)
    step scatter_bench scatter_bench 60 "$j" "$BIN/scatter_bench" --iters="$it_scatter" "${sc[@]}" --json="$j"
  fi
  if have transfer_gpu; then
    j=$(jtmp transfer_gpu_ipc)
    step "transfer_gpu ipc" transfer_gpu 60 "$j" "$BIN/transfer_gpu" --device=0 --rx-device=0 \
      --backends="$ipc" --models="$models" --iters="$it_ipc" --json="$j"
    if [[ $long != 0 ]]; then
      j=$(jtmp transfer_gpu_long)
      step "transfer_gpu long" transfer_gpu 60 "$j" "$BIN/transfer_gpu" --device=0 --rx-device=0 \
        --backends=cuda_ipc,cuda_ipc_packed,cuda_ipc_memcpy --models=llama-3-8b --tokens="$long" --iters=10 --json="$j"
    fi
    j=$(jtmp transfer_gpu_staged)
    step "transfer_gpu staged" transfer_gpu 60 "$j" "$BIN/transfer_gpu" --device=0 --rx-device=0 \
      --backends="$staged" --models="$models" --iters="$it_staged" --json="$j"
    if (( n >= 2 )); then
      j=$(jtmp transfer_gpu_two)
      step "transfer_gpu two" transfer_gpu 45 "$j" "$BIN/transfer_gpu" --device="${TWO_WRITER:-1}" \
        --rx-device="${TWO_RECEIVER:-0}" --backends="$two" --models="$models" --iters="$it_staged" --json="$j"
    fi
  fi
  if (( n >= 2 )) && have transfer_nccl; then
    j=$(jtmp transfer_nccl)
    step transfer_nccl transfer_nccl 90 "$j" "$BIN/transfer_nccl" --writer-device=0 --receiver-device=1 \
      --backends="$nccl" --models="${NCCL_MODELS:-$models}" --iters="$it_nccl" \
      ${CHUNK_MB:+--chunk-mb="$CHUNK_MB"} --json="$j"
  fi
  [[ ${CPU_COST:-0} == 1 && $smoke != 1 ]] && transfer_cpu_cost "$n"
  if have ucx_notify_rtt; then
    step ucx_notify_rtt ucx_notify_rtt 20 - "$BIN/ucx_notify_rtt" --iters="$([[ $smoke == 1 ]] && echo 500 || echo 3000)"
  fi
  if have transport_bw; then
    local tls
    for tls in ${BW_TLS:-sm,tcp tcp}; do
      if [[ $smoke == 1 ]]; then
        step "transport_bw $tls" transport_bw 30 - "$BIN/transport_bw" --tls "$tls" --sizes 1M,16M --reps 1 --seconds 0.3
        break
      fi
      step "transport_bw $tls" transport_bw 120 - "$BIN/transport_bw" --tls "$tls" --reps 3 --seconds 0.5
    done
  fi
  [[ $DRY_RUN == 1 ]] || grep -h -E '^llama|^qwen' "$(logf transfer_gpu)" "$(logf transfer_nccl)" 2> /dev/null | cut -c1-140 | tail -n 30
}

# The host CPU cost of the GPU data paths (bench/results/cpu_cost_2026-11-29.md): both processes'
# CPU time over each case's measured iterations (at least CPU_MS) and over idle spans.
transfer_cpu_cost() {
  local n=$1 j
  local common=(--models="${MODELS:-llama-3-8b}" --tokens="${TOKENS:-4096}" --iters="${ITERS:-10}"
                --idle-ms="${IDLE_MS:-200}" --cpu-ms="${CPU_MS:-200}")
  local gb=${CPU_BACKENDS:-cuda_ipc,ucx_staged,ucx_staged:p20,ucx_staged:p100}
  if have transfer_gpu; then
    j=$(jtmp cpu_one)
    step "cpu_cost transfer_gpu one" cpu_cost 60 "$j" "$BIN/transfer_gpu" --device=0 --rx-device=0 \
      --backends="$gb" "${common[@]}" --json="$j"
    if (( n >= 2 )); then
      j=$(jtmp cpu_two)
      step "cpu_cost transfer_gpu two" cpu_cost 60 "$j" "$BIN/transfer_gpu" --device=0 --rx-device=1 \
        --backends="$gb" "${common[@]}" --json="$j"
    fi
  fi
  if (( n >= 2 )) && have transfer_nccl; then
    j=$(jtmp cpu_nccl)
    step "cpu_cost transfer_nccl" cpu_cost 90 "$j" "$BIN/transfer_nccl" --writer-device=0 --receiver-device=1 \
      --backends="${CPU_NCCL_BACKENDS:-nccl}" "${common[@]}" --json="$j"
  fi
  [[ $DRY_RUN == 1 || ! -s $(rec cpu_cost) ]] && return
  python3 - "$(rec cpu_cost)" <<'PY' | tee "$OUT/cpu_cost_$(sfx).txt"
import json, sys
print(f"{'step':28} {'backend':17} {'case':14} {'GB/s':>7} {'W cores':>7} {'R cores':>7} {'W us/wr':>8} {'R us/wr':>8}")
for line in open(sys.argv[1]):
    j = json.loads(line)
    if "writer_cores" not in j: continue
    f = lambda k, w, d=2: f"{j[k]:{w}.{d}f}" if k in j else f"{'-':>{w}}"
    print(f"{j.get('step', '')[:28]:28} {j['backend'][:17]:17} {j['case'][:14]:14} {j.get('gbps', 0):7.1f} "
          f"{f('writer_cores', 7)} {f('receiver_cores', 7)} {f('writer_cpu_us_per_write', 8, 1)} "
          f"{f('receiver_cpu_us_per_write', 8, 1)}")
PY
}
