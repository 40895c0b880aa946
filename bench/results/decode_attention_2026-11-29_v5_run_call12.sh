#!/usr/bin/env bash
# decode_attention v5, device call 12 (issue 4, session 6): the final main (kernel unchanged
# since call 8; PagedDecodeDescribe's combine_dims and the bench's reporting of it): kernel
# tests + memcheck, a bench and timeline smoke run.
set -uo pipefail
d=.devbuild/fin
out=${OUT:-/tmp/out}
w=$(mktemp -d)
trap 'tar -C "$w" -czf "$out/all.tgz" .' EXIT
"$d/kernels_paged_attention_args_test" > "$w/tests.log" 2>&1
"$d/kernels_paged_attention_test" >> "$w/tests.log" 2>&1
bash "$d/run_memcheck.sh" "$d/kernels_paged_attention_test" > "$w/memcheck.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED|Failure|ERROR SUMMARY" "$w/tests.log" "$w/memcheck.log"
"$d/decode_attention" --models llama-3-8b,qwen2.5-7b --batches 1,8 --contexts 4096,16384 --schedules v2,wide_kernel,wide_cluster \
  --early wide_kernel --distances 1 --replays 5 --json "$w/smoke.jsonl" > "$w/smoke.log" 2>&1
sed -n '/^streaming read:/,$p' "$w/smoke.log"
grep -o '"variant":"[^"]*","schedule":"[^"]*".*"splits":[0-9]*,"cluster":[0-9]*,"combine_dims":[0-9]*' "$w/smoke.jsonl" | sed 's/"early_prefetch[^,]*,"prefetch":[a-z]*,"prefetch_distance":[0-9]*,//' | sort | uniq | head -20
"$d/decode_timeline" --models qwen2.5-7b --batches 1 --contexts 16384 --replays 2 --json "$w/timeline.jsonl" > "$w/timeline.log" 2>&1
python3 -c "
import json
for l in open('$w/timeline.jsonl'):
    j=json.loads(l); print(j['schedule'], j['splits'], 'early', j['early_units'], 'call %.2f'%j['us_call_timeline_off'], 'merge', j['cta_merge']['p50'], 'combine', j['combine_written'])"
