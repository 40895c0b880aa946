#!/usr/bin/env bash
# Single-thread encode rate: kvstream's tokenizer beside Hugging Face tokenizers, on the same
# machine, text and tokenizer files, one after the other (docs/tokenizers.md, "Encode rate").
#   bench/tokenizer_vs_reference.sh [SECONDS] [MODE]   (per side and tokenizer, default 5; MODE: lines, each line
#                                          one text (default), or whole, the file as one text)
# Needs BIN (default build/bin) with tokenizer_encode, and the reference REF (default node): node
# with the `tokenizers` package (NODE_PATH=<folder>/node_modules after `npm install
# tokenizers@0.23.2` there), or REF=python: Python with the `tokenizers` package.
# The text: the golden corpus 20 times, the licenses in /usr/share/common-licenses and a few
# Python sources (about 1.5 MB, written to OUT, default bench/out). Prints one JSON line per side
# and tokenizer, then a table with the ratio (kvstream / tokenizers; > 1: kvstream is faster).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
secs=${1:-5}
mode=${2:-lines}
BIN=${BIN:-$root/build/bin}
OUT=${OUT:-$root/bench/out}
mkdir -p "$OUT"
text=${TEXT:-$OUT/tokenizer_text.txt}  # TEXT: a text made earlier (the same bytes elsewhere)
[[ -n ${TEXT:-} ]] || python3 - "$root/tests/tokenizer/data/corpus.jsonl" "$text" <<'PY'
import glob, json, sys
lines = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8") if l.strip()]
parts = ["\n".join(l.replace("\n", " ") for l in lines)] * 20
for f in sorted(glob.glob("/usr/share/common-licenses/*")) + ["/usr/lib/python3.11/argparse.py", "/usr/lib/python3.11/textwrap.py", "/usr/lib/python3.11/json/decoder.py"]:
    try:
        parts.append(open(f, encoding="utf-8").read())
    except (OSError, UnicodeDecodeError, IsADirectoryError):
        pass
open(sys.argv[2], "w", encoding="utf-8").write("\n".join(parts) + "\n")
PY
echo "text: $(wc -c < "$text") bytes, $(wc -l < "$text") lines; $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
results=()
for family in llama3 qwen2 llama2; do
  tok=$root/tests/tokenizer/data/$family/tokenizer.json
  ours=$("$BIN/tokenizer_encode" "$tok" "$text" "$secs" "$mode")
  if [[ ${REF:-node} == python ]]; then
    ref=$(TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 python3 "$root/bench/tokenizer_encode_ref.py" "$tok" "$text" "$secs" "$mode")
  else
    ref=$(TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 node "$root/bench/tokenizer_encode_ref.js" "$tok" "$text" "$secs" "$mode")
  fi
  echo "$family $ours"
  echo "$family $ref"
  results+=("$family|$ours|$ref")
done
printf '\n%-8s %14s %14s %7s %s\n' tokenizer "kvstream MB/s" "tokenizers MB/s" ratio "same ids"
for r in "${results[@]}"; do
  IFS='|' read -r family ours ref <<< "$r"
  python3 - "$family" "$ours" "$ref" <<'PY'
import json, sys
a, b = json.loads(sys.argv[2]), json.loads(sys.argv[3])
print("%-8s %14.2f %14.2f %6.2fx %s" % (sys.argv[1], a["mb_per_s"], b["mb_per_s"], a["mb_per_s"] / b["mb_per_s"],
      "yes" if (a["checksum"], a["tokens"]) == (b["checksum"], b["tokens"]) else "NO"))
PY
done
