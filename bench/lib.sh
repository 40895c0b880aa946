# shellcheck shell=bash
# Shell helpers of bench/run.sh and its suites (sourced, not run). A step runs one program under
# a timeout cut to the budget left, its output in $OUT/<subject>_<date>[_<tag>].log and its JSON
# lines appended to $OUT/<subject>_<date>[_<tag>].jsonl, each labelled with the step and tag.
# With DRY_RUN=1 nothing runs: every command is printed as it would be run.
# Needs (set by run.sh): BIN, OUT, DATE, TAG, DRY_RUN, BENCH (this folder).

# ---- names and clock ----------------------------------------------------------------------------
sfx() { echo "${DATE}${TAG:+_$TAG}"; }
rec() { echo "$OUT/${1}_$(sfx).jsonl"; }   # rec SUBJECT: the subject's JSON lines
logf() { echo "$OUT/${1}_$(sfx).log"; }    # logf SUBJECT: the subject's program output
T0=$SECONDS
elapsed() { echo $(( SECONDS - T0 )); }
budget_left() { echo $(( BUDGET_END - SECONDS )); }
say() { echo "[$(elapsed)s] $*" >&2; }
# qcmd ARGS...: the command as shell words (a dry run's "$(cat PORTFILE)" stays as it would run).
# shellcheck disable=SC2016  # ('$(cat ' is matched literally)
qcmd() {
  local a out=""
  for a in "$@"; do
    if [[ $a =~ ^[A-Za-z0-9_./:=,+@%^-]+$ ]]; then out+="$a "
    elif [[ $a == *'$(cat '* ]]; then out+="\"$a\" "
    else out+="$(printf '%q' "$a") "; fi
  done
  echo "${out% }"
}

# ---- steps ----------------------------------------------------------------------------------
STEP_NAMES=() STEP_RC=() STEP_S=() STEP_N=() STEP_OUT=()
# jtmp NAME: a fresh path for a step's JSON lines (the program's --json file).
jtmp() { local p="$TMP/${1//[^A-Za-z0-9_.-]/_}.jsonl"; [[ $DRY_RUN == 1 ]] || rm -f "$p"; echo "$p"; }
# step NAME SUBJECT WANT_S JSON CMD...: runs CMD (timeout min(WANT_S, budget left)); then JSON's
# lines (JSON "-": the lines of its output that start with "{"; "none": nothing; JSON_SKIP=N:
# all but the first N) go to `rec SUBJECT`.
step() {
  local name=$1 subj=$2 want=$3 json=$4; shift 4
  local t left; left=$(( $(budget_left) - 5 )); t=$(( want < left ? want : left ))
  if [[ $DRY_RUN == 1 ]]; then
    echo "$(qcmd timeout -k 5 "$want" "$@") >> $(logf "$subj") 2>&1"
    [[ $json == - ]] && json="its output lines that start with {"
    [[ $json == none ]] || echo "  # step \"$name\": JSON lines of $json${JSON_SKIP:+ after line $JSON_SKIP} -> $(rec "$subj")"
    return 0
  fi
  if (( t < 5 )); then
    say "$name: skipped (budget spent)"
    STEP_NAMES+=("$name") STEP_RC+=(skip) STEP_S+=(0) STEP_N+=(0) STEP_OUT+=("$subj"); return 0
  fi
  local log s0=$SECONDS rc l0; log=$(logf "$subj")
  l0=$( [[ -f $log ]] && wc -l < "$log" || echo 0)
  say "$name (timeout ${t}s)"
  { echo "=== $name ($(date -u +%T), timeout ${t}s)"; echo "\$ $(qcmd "$@")"; } >> "$log"
  timeout -k 5 "$t" "$@" >> "$log" 2>&1
  rc=$?
  echo "=== $name rc=$rc ($(( SECONDS - s0 ))s)" >> "$log"
  local src=$json n=0
  if [[ $json == - ]]; then src="$TMP/stdout.jsonl"; tail -n +$(( l0 + 1 )) "$log" | grep '^{' > "$src"; fi
  if [[ -n ${JSON_SKIP:-} && -f $src ]]; then tail -n +$(( JSON_SKIP + 1 )) "$src" > "$TMP/skip.jsonl"; src="$TMP/skip.jsonl"; fi
  [[ -s $src ]] && n=$(label_json "$src" "$name" >> "$(rec "$subj")"; grep -c '^{' "$src")
  say "$name: rc=$rc, $n records, $(( SECONDS - s0 ))s"
  STEP_NAMES+=("$name") STEP_RC+=("$rc") STEP_S+=($(( SECONDS - s0 ))) STEP_N+=("$n") STEP_OUT+=("$subj")
  return $rc
}
# label_json FILE STEP: FILE's JSON lines with "step" and "tag" added (as is without python3).
label_json() {
  if command -v python3 > /dev/null; then
    python3 -c '
import json, sys
for l in open(sys.argv[1]):
    l = l.strip()
    if not l.startswith("{"): continue
    try: j = json.loads(l)
    except ValueError: print(l); continue
    j.setdefault("step", sys.argv[2]); j.setdefault("tag", sys.argv[3]); print(json.dumps(j))' "$1" "$2" "$TAG"
  else grep '^{' "$1"; fi
}
# have PROGRAM: the binary is in $BIN (a dry run lists it anyway, saying when it is missing).
have() {
  [[ -x $BIN/$1 ]] && return 0
  if [[ $DRY_RUN == 1 ]]; then echo "# ($BIN/$1 is not built here: listed anyway)"; return 0; fi
  say "$1: not in $BIN, skipped"; STEP_NAMES+=("$1") STEP_RC+=(absent) STEP_S+=(0) STEP_N+=(0) STEP_OUT+=(-)
  return 1
}
ngpus() {
  if [[ -n ${NGPU:-} ]]; then echo "$NGPU"; return; fi
  if command -v nvidia-smi > /dev/null; then nvidia-smi -L 2> /dev/null | grep -c '^GPU'; return; fi
  if [[ $DRY_RUN == 1 ]]; then echo 2; else echo 0; fi  # a dry run lists the two-GPU steps too
}

# ---- the machine ----------------------------------------------------------------------------
write_machine() {  # appends one block per run.sh call to $OUT/machine.txt
  {
    echo "=== bench/run.sh $* (tag '${TAG}') at $(date -u '+%F %T') UTC"
    echo "commit: $(git -C "$BENCH/.." rev-parse --short HEAD 2> /dev/null || echo "${COMMIT:-unknown (no .git here; set COMMIT=...)}")"
    echo "binaries: $BIN"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm,pci.bus_id --format=csv 2>&1
    nvidia-smi topo -m 2>&1 | head -12
    echo "cpus $(nproc), kernel $(uname -r), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  } >> "$OUT/machine.txt"
}

# ---- MPS (MPS=1: both daemons as clients of an MPS server; one GPU shared by two processes is
# otherwise time-sliced between their contexts, bench/results/decode_step_2026-11-29.md) -------
MPS_CONTROL=""
mps_start() {
  [[ ${MPS:-0} == 1 ]] || return 0
  if [[ $DRY_RUN == 1 ]]; then echo "nvidia-cuda-mps-control -d   # pipe and log folders under \$TMP"; return 0; fi
  MPS_CONTROL=$(command -v nvidia-cuda-mps-control || true)
  [[ -n $MPS_CONTROL ]] || { say "MPS=1 but nvidia-cuda-mps-control is not installed: no MPS"; return 0; }
  export CUDA_MPS_PIPE_DIRECTORY="$TMP/mps_pipe" CUDA_MPS_LOG_DIRECTORY="$TMP/mps_log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if "$MPS_CONTROL" -d; then say "MPS server started"; else
    say "MPS server did not start: no MPS"; MPS_CONTROL=""
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
}
mps_stop() { [[ -n $MPS_CONTROL ]] && echo quit | "$MPS_CONTROL" > /dev/null 2>&1; MPS_CONTROL=""; }

# ---- daemons (ttft, itl) ----------------------------------------------------------------------
DAEMON_PIDS=()
# spawn LOG CMD...: CMD in the background (stdout and stderr appended to LOG, the command line to
# $OUT/daemons_<date>.log); its pid in $SPAWNED.
spawn() {
  local log=$1; shift
  if [[ $DRY_RUN == 1 ]]; then echo "$(qcmd "$@") >> $log 2>&1 &"; SPAWNED=0; return; fi
  echo "[$(date -u +%T)] \$ $(qcmd "$@")" >> "$OUT/daemons_$(sfx).log"  # what ran, for the record
  "$@" >> "$log" 2>&1 &
  SPAWNED=$!
  DAEMON_PIDS+=("$SPAWNED")
}
# wait_port FILE PID: the port the daemon wrote to FILE once serving (in $PORT_READ); 1 if it exited.
# shellcheck disable=SC2034  # PORT_READ: for the suites
wait_port() {
  if [[ $DRY_RUN == 1 ]]; then PORT_READ="\$(cat $1)"; return 0; fi
  local _
  for _ in $(seq 1 600); do
    [[ -s $1 ]] && { PORT_READ=$(cat "$1"); return 0; }
    kill -0 "$2" 2> /dev/null || return 1
    sleep 0.1
  done
  return 1
}
stop_pid() {
  local p=$1 _
  [[ -z $p || $p == 0 ]] && return
  kill -TERM "$p" 2> /dev/null
  for _ in $(seq 1 100); do kill -0 "$p" 2> /dev/null || break; sleep 0.1; done
  kill -KILL "$p" 2> /dev/null
  wait "$p" 2> /dev/null
}
cleanup() {
  local p
  for p in "${DAEMON_PIDS[@]}"; do kill -0 "$p" 2> /dev/null && stop_pid "$p"; done
  mps_stop
  [[ $DRY_RUN == 1 ]] || rm -rf "$TMP"
}

# ---- the table printed last -------------------------------------------------------------------
print_table() {
  local i
  [[ ${#STEP_NAMES[@]} == 0 ]] && return
  printf '\n%-44s %6s %6s %8s  %s\n' step rc s records file
  local f
  for i in "${!STEP_NAMES[@]}"; do
    f=-; [[ ${STEP_OUT[$i]} == - ]] || f=$(basename "$(rec "${STEP_OUT[$i]}")")
    printf '%-44s %6s %6s %8s  %s\n' "${STEP_NAMES[$i]:0:44}" "${STEP_RC[$i]}" "${STEP_S[$i]}" "${STEP_N[$i]}" "$f"
  done
}
