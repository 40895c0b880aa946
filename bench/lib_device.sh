# Sourced by the GPU bench scripts (run_itl_gpu.sh, run_ttft_gpu.sh) after their knobs, with $B
# (the binaries' folder) set: makes $B and $OUT (default ./out, created) absolute, makes a
# temporary folder $TMP removed on exit (with the MPS server stopped: bench/gpu_mps.sh, sourced
# here), starts the script's clock (elapsed: seconds since), defines log() (a line with the
# elapsed time on stderr and in $OUT/summary.txt) and writes $OUT/machine.txt (date, GPUs,
# cores, kernel, binaries).
B=$(cd "$B" && pwd)
OUT=${OUT:-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
TMP=$(mktemp -d)
source "$(dirname "${BASH_SOURCE[0]}")/gpu_mps.sh"  # MPS=1: both daemons as clients of an MPS server
trap 'mps_stop; rm -rf "$TMP"' EXIT
START=$(date +%s)
elapsed() { echo $(( $(date +%s) - START )); }
log() { echo "[$(elapsed)s] $*" | tee -a "$OUT/summary.txt" >&2; }

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1
  echo "nproc $(nproc)"
  uname -r
  echo "binaries: $B"
} > "$OUT/machine.txt"
