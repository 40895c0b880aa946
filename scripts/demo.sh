#!/usr/bin/env bash
# The README's demo: installs what is missing (apt), builds, and runs generation.
# Until the daemons exist this is single-process (colocated) generation on the CPU backend:
# the tiny preset, then (KVSTREAM_DEMO_LLAMA=1) a llama-2-7b-shaped model cut to 2 layers.
# Safe to run twice.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
build=${KVSTREAM_BUILD_DIR:-$root/build}
kv="$build/bin/kvstream"

echo
echo "== kvstream generate: tiny preset, CPU backend, prompt 1,2,3,4,5,6,7,8 =="
"$kv" generate --model tiny --prompt-tokens 1,2,3,4,5,6,7,8 --max-new-tokens 16
echo
echo "== kvstream generate: tiny preset, 256-token prompt =="
"$kv" generate --model tiny --prompt-len 256 --max-new-tokens 8
echo
echo "== HF checkpoint round trip: make-checkpoint (bf16) then generate from the directory =="
ck=$(mktemp -d /tmp/kvstream-demo-ck.XXXXXX)
trap 'rm -rf "$ck"' EXIT
"$kv" make-checkpoint --model tiny --dtype bf16 --out "$ck/tiny-bf16"
"$kv" generate --model "$ck/tiny-bf16" --prompt-tokens 1,2,3,4,5,6,7,8 --max-new-tokens 8
if [ "${KVSTREAM_DEMO_LLAMA:-0}" = 1 ]; then
  echo
  echo "== llama-2-7b shapes, first 2 layers (dummy weights; slow on a small CPU) =="
  "$kv" generate --model llama-2-7b --layers 2 --prompt-len 32 --max-new-tokens 4
fi
