# Sourced by bench/lib_device.sh (for run_itl_gpu.sh, run_ttft_gpu.sh): an MPS server for the
# daemons when MPS=1. One GPU shared by two processes is otherwise time-sliced between their
# contexts, which costs the decode ~1.2x whenever the prefill submits anything
# (bench/results/decode_step_2026-11-29.md). The server gets its own pipe directory under $TMP
# and is stopped by mps_stop (call it from the caller's EXIT trap). Needs $TMP and log().
MPS=${MPS:-0}
MPS_CONTROL=""
mps_stop() {
  [[ -n "$MPS_CONTROL" ]] && echo quit | "$MPS_CONTROL" > /dev/null 2>&1
  MPS_CONTROL=""
}
mps_start() {
  [[ "$MPS" == 1 ]] || return 0
  MPS_CONTROL=$(command -v nvidia-cuda-mps-control || true)
  if [[ -z "$MPS_CONTROL" ]]; then
    log "MPS=1 but nvidia-cuda-mps-control is not installed: running without MPS"
    return 0
  fi
  export CUDA_MPS_PIPE_DIRECTORY="$TMP/mps_pipe" CUDA_MPS_LOG_DIRECTORY="$TMP/mps_log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if "$MPS_CONTROL" -d; then
    log "MPS server started ($MPS_CONTROL, pipe $CUDA_MPS_PIPE_DIRECTORY)"
  else
    log "MPS server did not start: running without MPS"
    MPS_CONTROL=""
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
}
