#!/usr/bin/env bash
# One GPU sitting: bench/run.sh SUITE... [KEY=VALUE...] [--tag LABEL] [--dry-run]
#
# Runs on the GPU machine from the repository root, with prebuilt binaries (BIN, default
# build/bin) and their bundled libraries (LIBS/env.sh, default .devlibs/env.sh, sourced here when
# present; /work/shared/device/README.md says how to bundle them).
#
# Suites (each beside its baseline in the same run; the knobs are in the suite files):
#   decode      decode_attention (schedules, ceilings), decode_timeline, ncu, PyTorch SDPA, the
#               comparison                                               bench/suite_kernels.sh
#   under-load  decode_under_load (+ --early), its plot                   bench/suite_kernels.sh
#   prefill     prefill_attention and PyTorch SDPA causal                 bench/suite_kernels.sh
#   step        decode_step, and beside copy_load in another process      bench/suite_kernels.sh
#   sampling    sampling_step: the decode step sampled vs greedy (batch 32)  bench/suite_kernels.sh
#   tiers       tier_prefetch: TTFT with an 8k prefix from the pinned host tier bench/suite_kernels.sh
#   tiers-load  tier_prefetch --interference: prefill tokens/s, decode p99 while the tier
#               prefetches, vs idle (about 80 s, estimated)               bench/suite_kernels.sh
#   tests       the GPU test binaries in BIN, memcheck of the kernel test bench/suite_kernels.sh
#   transfer    scatter_bench, transfer_gpu (cuda_ipc, ucx_staged, two GPUs), transfer_nccl,
#               ucx_notify_rtt, transport_bw (CPU_COST=1: host CPU time)  bench/suite_transfer.sh
#   ttft        kvstream bench ttft through the two daemons               bench/suite_daemons.sh
#   netns       two network hosts on one machine (veth pair, tc rate limits): ucx_perftest,
#               transfer_gpu and TTFT across them, UCX_TLS=tcp,cuda_copy   bench/suite_netns.sh
#   itl         kvstream bench itl: ITL while prompts land, pacing A/B/D/C bench/suite_daemons.sh
#   auth        auth_overhead: TTFT plain / tokens / mTLS, CPU daemons    bench/suite_daemons.sh
#   metrics     metrics on / off: TTFT, 64-stream tokens/s; metrics_cost   bench/suite_daemons.sh
#   smoke       a short run of each suite but tests (a few minutes), for before/after checks
#   all         tests decode under-load prefill step sampling tiers tiers-load transfer ttft itl auth
#               metrics
#
# Output (OUT, default bench/out): <subject>_<date>[_<tag>].jsonl (every JSON line of the
# subject's programs, each labelled with "step" and "tag"), <subject>_<date>[_<tag>].log (their
# output), machine.txt (GPUs, topology, CPUs, commit, binaries; one block per call); a table of
# every step is printed last. Raw records stay out of the tree: copy what a summary needs into
# bench/results/ and add its row to bench/results/INDEX.md.
#
# Options:
#   KEY=VALUE   a knob (exported: environment switches of the programs pass through too), e.g.
#               BIN=old/bin LIBS=old/.devlibs OUT=... DATE=... BUDGET=seconds NGPU=2 MPS=1
#   --tag LABEL labels this run's files (two builds side by side in one call:
#               bench/run.sh smoke BIN=old/bin --tag old; bench/run.sh smoke --tag new)
#   --dry-run   prints every command it would run, runs nothing
# BUDGET: wall seconds for the whole call (default: each suite's own; smoke 300). A step's
# timeout is cut to what is left; a step that would get under 5 s is skipped. (A device call may
# run 10 minutes at most: give `all` a BUDGET, or run its suites in separate calls.)
# shellcheck source-path=SCRIPTDIR
set -uo pipefail
BENCH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
usage() { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }
declare -A SUITE_BUDGET=([decode]=420 [under-load]=300 [prefill]=200 [step]=200 [tests]=300
                         [transfer]=420 [ttft]=300 [itl]=300 [auth]=300 [metrics]=420 [sampling]=200
                         [tiers]=200 [tiers-load]=270 [netns]=560)
ALL="tests decode under-load prefill step sampling tiers tiers-load transfer ttft itl auth metrics"
SUITES=() DRY_RUN=0 TAG=""
while (( $# )); do
  case $1 in
    -h | --help) usage; exit 0 ;;
    -n | --dry-run) DRY_RUN=1 ;;
    --tag) TAG=${2:?--tag needs a label}; shift ;;
    --tag=*) TAG=${1#--tag=} ;;
    [A-Z_]*=*) export "${1?}" ;;
    all) read -r -a _all <<< "$ALL"; SUITES+=("${_all[@]}") ;;
    smoke | decode | under-load | prefill | step | sampling | tiers | tiers-load | tests | transfer | ttft | itl | auth | metrics | netns)
      SUITES+=("$1") ;;
    *) echo "bench/run.sh: unknown argument '$1' (bench/run.sh --help)" >&2; exit 2 ;;
  esac
  shift
done
(( ${#SUITES[@]} )) || { usage >&2; exit 2; }
[[ $TAG =~ ^[A-Za-z0-9_.-]*$ ]] || { echo "bench/run.sh: --tag: letters, digits, . _ - only" >&2; exit 2; }
BIN=${BIN:-build/bin}
[[ -d $BIN ]] && BIN=$(cd "$BIN" && pwd)
OUT=${OUT:-bench/out}
DATE=${DATE:-$(date -u +%F)}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}  # the lent machines need it (shared/device/README.md)

# shellcheck source=lib.sh
source "$BENCH/lib.sh"
# shellcheck source=suite_kernels.sh
source "$BENCH/suite_kernels.sh"
# shellcheck source=suite_transfer.sh
source "$BENCH/suite_transfer.sh"
# shellcheck source=suite_daemons.sh
source "$BENCH/suite_daemons.sh"
# shellcheck source=suite_netns.sh
source "$BENCH/suite_netns.sh"

env_sh=${LIBS:-.devlibs}/env.sh
if [[ $DRY_RUN == 1 ]]; then
  TMP=/tmp/bench-run.dry
  echo "# bench/run.sh ${SUITES[*]} (dry run): BIN=$BIN OUT=$OUT DATE=$DATE TAG=$TAG GPUs=$(ngpus)"
  [[ -f $env_sh ]] && echo "source $env_sh"
else
  mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
  TMP=$(mktemp -d)
  # shellcheck disable=SC1090
  [[ -f $env_sh ]] && source "$env_sh"
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  write_machine "${SUITES[@]}"
fi

[[ -n ${BUDGET:-} ]] && BUDGET_END=$(( SECONDS + BUDGET ))
for s in "${SUITES[@]}"; do
  if [[ $s == smoke ]]; then
    [[ -n ${BUDGET:-} ]] || BUDGET_END=$(( SECONDS + 300 ))
    for s2 in decode under-load prefill step sampling tiers tiers-load transfer ttft itl auth metrics; do
      [[ $DRY_RUN == 1 ]] && echo && echo "# --- smoke: $s2"
      SMOKE=1 "suite_${s2//-/_}"
    done
    continue
  fi
  [[ -n ${BUDGET:-} ]] || BUDGET_END=$(( SECONDS + ${SUITE_BUDGET[$s]} ))
  [[ $DRY_RUN == 1 ]] && echo && echo "# --- $s"
  "suite_${s//-/_}"
done
[[ $DRY_RUN == 1 ]] && exit 0
print_table
echo "records in $OUT (date $DATE${TAG:+, tag $TAG}); $(elapsed)s in all"
