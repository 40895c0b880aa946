# shellcheck shell=bash
# bench/run.sh's kernel suites (sourced): decode, under-load, prefill, step, and tests (the GPU
# test binaries a sitting runs before it measures). SMOKE=1 picks short runs of each.
# Knobs (KEY=VALUE on run.sh's command line) are listed with each suite.

# decode: bench/decode_attention (every schedule beside v2, the streaming-read, same-size and
# paged-read ceilings), decode_timeline (per-CTA phases), Nsight Compute DRAM bytes of one shape
# (where ncu is installed), PyTorch SDPA on the same shapes (bench/sdpa_baseline.py), and
# bench/compare_decode.py's merge of the two ($OUT/decode_compare_<date>.txt).
# Knobs: DECODE_ARGS (decode_attention's flags; default: its whole sweep), TIMELINE_ARGS,
# NCU=0|1 (default 1 where ncu is found), NCU_ARGS, NCU_LAUNCHES (8), SDPA=0|1 (1), SDPA_ARGS,
# DECODE_TIMEOUT (200), SDPA_TIMEOUT (230).
suite_decode() {
  local da tl sd ncu_bin
  # shellcheck disable=SC2206,SC2054  # knobs: flag lists split on blanks; commas in flag values
  if [[ ${SMOKE:-0} == 1 ]]; then
    da=(--models llama-3-8b --batches 1,8 --contexts 4096 --replays 3 --distances "")
    tl=(--models qwen2.5-7b --batches 1 --contexts 16384 --replays 2)
    sd=(--models llama-3-8b --batches 1,8 --contexts 4096 --replays 3)
  else
    da=(${DECODE_ARGS:-}) sd=(${SDPA_ARGS:-})
    tl=(${TIMELINE_ARGS:---models qwen2.5-7b,llama-3-8b,llama-2-7b --batches 1,8 --contexts 16384 --schedules auto --replays 3})
  fi
  local paged sdpa
  paged=$(jtmp decode_attention)
  have decode_attention &&
    step decode_attention decode_attention "${DECODE_TIMEOUT:-200}" "$paged" \
      "$BIN/decode_attention" "${da[@]}" --json "$paged"
  if have decode_timeline; then
    local j; j=$(jtmp decode_timeline)
    step decode_timeline decode_timeline 60 "$j" "$BIN/decode_timeline" "${tl[@]}" --json "$j"
  fi
  ncu_bin=$(command -v ncu || compgen -G '/opt/nvidia/nsight-compute/*/ncu' || compgen -G /usr/local/cuda/bin/ncu)
  ncu_bin=${ncu_bin%%$'\n'*}
  [[ $DRY_RUN == 1 && -z $ncu_bin ]] && ncu_bin=ncu
  if [[ ${SMOKE:-0} != 1 && ${NCU:-1} == 1 && -n $ncu_bin ]] && have decode_attention; then
    # The bench's first launches (one per kernel and prefetch variant, before timing), cold L2.
    # shellcheck disable=SC2206
    local na=(${NCU_ARGS:---models llama-3-8b --batches 32 --contexts 8192 --replays 1})
    step decode_ncu decode_ncu 90 none "$ncu_bin" --clock-control none --cache-control all \
      -k regex:'PagedDecode|CombineSplits' --launch-count "${NCU_LAUNCHES:-8}" \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_read_lookup_hit.sum,lts__t_sectors_op_read_lookup_miss.sum \
      "$BIN/decode_attention" "${na[@]}"
  fi
  sdpa=$(jtmp sdpa)
  if [[ ${SDPA:-1} == 1 ]]; then
    step sdpa_baseline sdpa "${SDPA_TIMEOUT:-230}" "$sdpa" \
      env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 python3 "$BENCH/sdpa_baseline.py" "${sd[@]}" --json "$sdpa"
  fi
  local cmp; cmp="$OUT/decode_compare_$(sfx).txt"
  if [[ $DRY_RUN == 1 ]]; then
    echo "$(qcmd python3 "$BENCH/compare_decode.py" "$paged" "$sdpa") > $cmp"
  elif [[ -s $paged ]]; then
    local inputs=("$paged"); [[ -s $sdpa ]] && inputs+=("$sdpa")
    python3 "$BENCH/compare_decode.py" "${inputs[@]}" > "$cmp" 2>&1
    sed -n '/^streaming read:/,$p' "$(logf decode_attention)" | tail -n 12 | cut -c1-110
    tail -n 20 "$cmp"
  fi
}

# under-load: bench/decode_under_load (the decode kernel while KV lands at paced rates: d2d, h2d,
# and with two GPUs peer and nccl), then the same with the early prefetch, and the plot.
# Knobs: UNDER_LOAD_ARGS (default: its defaults), EARLY=0|1 (1), EARLY_ARGS, PLOT=0|1 (1).
suite_under_load() {
  local a e j early=${EARLY:-1} plot=${PLOT:-1}
  # shellcheck disable=SC2206
  a=(${UNDER_LOAD_ARGS:-}) e=(${EARLY_ARGS:---models llama-3-8b --batches 1,8 --contexts 16384,32768 --rates 0,50,100})
  [[ ${SMOKE:-0} == 1 ]] && a=(--quick) && early=0 && plot=0
  have decode_under_load || return
  j=$(jtmp decode_under_load)
  step decode_under_load decode_under_load 240 "$j" "$BIN/decode_under_load" "${a[@]}" --json "$j"
  if [[ $plot == 1 ]]; then
    if [[ $DRY_RUN == 1 ]]; then
      qcmd python3 "$BENCH/plot_under_load.py" "$j" -o "$OUT/decode_under_load_$(sfx).png"
    elif [[ -s $j ]]; then
      python3 "$BENCH/plot_under_load.py" "$j" -o "$OUT/decode_under_load_$(sfx).png" >&2
    fi
  fi
  if [[ $early == 1 ]]; then
    j=$(jtmp decode_under_load_early)
    step decode_under_load_early decode_under_load 120 "$j" "$BIN/decode_under_load" --early "${e[@]}" --json "$j"
  fi
}

# prefill: bench/prefill_attention (TFLOP/s per prompt length), then bench/prefill_sdpa.py, which
# reads those lines, times PyTorch SDPA on the same shapes and appends its own.
# Knobs: PROMPTS (1024,4096,16384,32768), PREFILL_ITERS (5).
suite_prefill() {
  local p=${PROMPTS:-1024,4096,16384,32768} it=${PREFILL_ITERS:-5} j
  [[ ${SMOKE:-0} == 1 ]] && p=4096 && it=3
  have prefill_attention || return
  j=$(jtmp prefill_attention)
  step prefill_attention prefill_attention 120 "$j" "$BIN/prefill_attention" --json "$j" --prompts "$p" --iters "$it"
  local n=0; [[ -f $j ]] && n=$(wc -l < "$j")
  JSON_SKIP=$n step prefill_sdpa prefill_attention 150 "$j" \
    env -u LD_LIBRARY_PATH python3 "$BENCH/prefill_sdpa.py" --json "$j" --prompts "$p" --iters "$it"
}

# step: bench/decode_step (the CUDA backend's whole decode step with joiners, equal-bytes
# controls, a batch sweep), then the step beside another process's copies: decode_step traced
# while bench/copy_load copies at each of COPY_LOADS (mode:GB/s, 0 = unlimited) in turn.
# Knobs: STEP_ARGS, COPY_LOADS ("ce:200 sm:200 ce:400 sm:400 ce:0 sm:0"), COPY_S (3.5).
suite_step() {
  local a j
  # shellcheck disable=SC2206
  a=(${STEP_ARGS:---streams 32 --ctx 4096 --joiners 1,2,4 --joiner-ctx 16384 --sweep 28:48 --sweep-ctx 1024 --iters 30})
  local loads=${COPY_LOADS:-ce:200 sm:200 ce:400 sm:400 ce:0 sm:0} secs=${COPY_S:-3.5} iters=4200
  [[ ${SMOKE:-0} == 1 ]] && a=(--streams 8 --ctx 4096 --joiners 1 --sweep none --iters 10) && loads="ce:0" && iters=600
  have decode_step || return
  j=$(jtmp decode_step)
  step decode_step decode_step 150 "$j" "$BIN/decode_step" "${a[@]}" --json "$j"
  [[ -z $loads ]] && return
  have copy_load || return
  local trace l; trace="$OUT/decode_step_trace_$(sfx).txt"
  spawn "$(logf decode_step)" "$BIN/decode_step" --streams 32 --ctx 4096 --joiners 0 --sweep none \
    --iters "$iters" --trace "$trace"
  local bg=$SPAWNED
  [[ $DRY_RUN == 1 ]] || sleep 3  # the step's warm-up: the first window is "nothing"
  for l in $loads; do
    step "copy_load ${l}" copy_load 30 - "$BIN/copy_load" --mode "${l%%:*}" --gbps "${l#*:}" --seconds "$secs"
    [[ $DRY_RUN == 1 ]] || sleep 1
  done
  if [[ $DRY_RUN == 1 ]]; then echo "wait   # decode_step --trace $trace"; else wait "$bg"; fi
}

# sampling: bench/sampling_step (the CUDA backend's decode step at batch 32, llama-3-8b's
# 128256-token vocabulary: greedy and sampled configurations interleaved; target <= 1.03 of
# greedy for top-k + top-p, issue 17). Knobs: SAMPLING_ARGS.
suite_sampling() {
  local a j
  # shellcheck disable=SC2206
  a=(${SAMPLING_ARGS:---batch 32 --ctx 1024 --iters 40})
  [[ ${SMOKE:-0} == 1 ]] && a=(--batch 32 --ctx 1024 --iters 5 --layers 4)
  have sampling_step || return
  j=$(jtmp sampling_step)
  step sampling_step sampling_step 150 "$j" "$BIN/sampling_step" "${a[@]}" --json "$j"
}

# tiers: bench/tier_prefetch (issue 16): TTFT of an 8k-token prefix fetched layer by layer from
# the pinned host tier plus a 256-token suffix, vs recomputing the prompt and vs the floor; the
# copy rate vs pinned cudaMemcpy (copy engines, and the gather kernel at several widths).
# Knobs: TIER_ARGS.
suite_tiers() {
  local a j
  # shellcheck disable=SC2206
  a=(${TIER_ARGS:---model llama-3-8b --prefix 8192 --suffix 256 --reps 5 --ctas 0,16,32,64,132})
  [[ ${SMOKE:-0} == 1 ]] && a=(--prefix 1024 --suffix 64 --reps 2 --layers 4 --ctas "0,32")
  have tier_prefetch || return
  j=$(jtmp tier_prefetch)
  step tier_prefetch tier_prefetch 200 "$j" "$BIN/tier_prefetch" "${a[@]}" --json "$j"
}

# tiers-load: bench/tier_prefetch --interference (issue 16): prefill tokens/s (16 prompts of 2048
# tokens) and decode step p50/p99 (32 streams at 4096, 200 steps) with the tier idle and while it
# fetches 8k-token prefixes into other pool blocks continuously (copy engines; gather kernel, 16
# thread blocks); ratios against idle (targets >= 0.95 and <= 1.1). About 80 s on one H200
# (estimate: 3 cases x 6 reps x (~1.1 s of prefill + ~2 s of decode) + setup). Knobs: TIER_LOAD_ARGS.
suite_tiers_load() {
  local a j
  # shellcheck disable=SC2206
  a=(${TIER_LOAD_ARGS:---model llama-3-8b --prefix 8192 --bg-prefixes 2 --bg-depth 2 --ctas 0,16 --prompt 2048 --prompts 16 --streams 32 --ctx 4096 --steps 200 --reps 5})
  [[ ${SMOKE:-0} == 1 ]] &&
    a=(--layers 4 --prefix 1024 --ctas 0 --prompt 256 --prompts 4 --streams 8 --ctx 512 --steps 20 --reps 2)
  have tier_prefetch || return
  j=$(jtmp tier_interference)
  step tier_interference tier_interference 240 "$j" "$BIN/tier_prefetch" --interference "${a[@]}" --json "$j"
}

# tests: the GPU test binaries of $BIN (each run plainly; the daemons' test finds the daemons
# through KVSTREAM_PREFILL_BIN / KVSTREAM_DECODE_BIN), then compute-sanitizer over the kernel test.
# Knobs: TESTS (names in $BIN; default: every *gpu*test* and the kernel/model GPU tests there),
# GTEST_FILTER, MEMCHECK=0|1 (1).
suite_tests() {
  local t names
  if [[ -n ${TESTS:-} ]]; then names=$TESTS; else
    names=$(cd "$BIN" 2> /dev/null || exit
            for g in '*gpu*test*' 'kernels_paged_attention*test' layer_kernels_test cuda_backend_test; do
              compgen -G "$g"
            done | sort -u | tr '\n' ' ')
    [[ -z $names && $DRY_RUN == 1 ]] && names="kernels_paged_attention_test daemons_gpu_test"
  fi
  [[ ${SMOKE:-0} == 1 ]] && names="kernels_paged_attention_args_test"
  export KVSTREAM_PREFILL_BIN="$BIN/kvstream-prefill" KVSTREAM_DECODE_BIN="$BIN/kvstream-decode"
  [[ $DRY_RUN == 1 ]] && echo "export KVSTREAM_PREFILL_BIN=$BIN/kvstream-prefill KVSTREAM_DECODE_BIN=$BIN/kvstream-decode"
  for t in $names; do
    have "$t" || continue
    step "$t" gpu_tests 180 none "$BIN/$t" ${GTEST_FILTER:+--gtest_filter="$GTEST_FILTER"}
  done
  local mc; mc=$(find "$BENCH/../tests" -name run_memcheck.sh 2> /dev/null | head -1)
  if [[ ${SMOKE:-0} != 1 && ${MEMCHECK:-1} == 1 && -n $mc ]] && have kernels_paged_attention_test; then
    step memcheck gpu_tests 120 none bash "$mc" "$BIN/kernels_paged_attention_test"
  fi
  [[ $DRY_RUN == 1 ]] || grep -h -E '^\[  (PASSED|FAILED) |^\[  FAILED  \]|ERROR SUMMARY' "$(logf gpu_tests)" 2> /dev/null | head -30
}
