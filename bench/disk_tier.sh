#!/usr/bin/env bash
# The disk tier's write-down and read rates beside fio, in one run (bench/disk_tier.cc):
#   bash bench/disk_tier.sh [DIR] [extra disk_tier flags...]
# DIR (default bench/out/disk_tier.d, on the disk under test) is emptied of the bench's entries
# and fio's files afterwards. Prints the machine (CPUs, memory), the disk DIR is on (df, lsblk:
# device, rotational, size) and fio's version, then disk_tier's figures and ratio; appends its
# JSON line to OUT (default bench/out/disk_tier_<date>.jsonl). Needs fio: said, exit 3, if missing.
# Knobs (environment): BIN (default build/bin), BLOCKS (512), QD (4), WRITE_THREADS (4).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${1:-$root/bench/out/disk_tier.d}
shift || true
BIN=${BIN:-$root/build/bin}
OUT=${OUT:-$root/bench/out/disk_tier_$(date -u +%F).jsonl}
mkdir -p "$dir" "$(dirname "$OUT")"
if ! command -v fio > /dev/null; then
  echo "disk_tier.sh: fio NOT FOUND: install it (apt-get install -y fio; scripts/install-deps.sh)" >&2
  echo "disk_tier.sh: the disk tier's figures follow, without the fio baseline and ratio" >&2
fi
echo "== $(date -u '+%F %T UTC') $(git -C "$root" rev-parse --short HEAD 2> /dev/null) on $(hostname)"
echo "cpus: $(nproc) ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))"
echo "memory: $(free -g | awk '/^Mem:/ {print $2 " GiB"}')"
echo "load: $(cut -d" " -f1-3 /proc/loadavg) (1, 5, 15 min)"
echo "fio: $(fio --version 2> /dev/null || echo missing)"
df -hT "$dir" | sed 's/^/df: /'
dev=$(df --output=source "$dir" | tail -1)
lsblk -d -o NAME,ROTA,SIZE,MODEL,TYPE "$dev" 2> /dev/null | sed 's/^/lsblk: /' ||
  lsblk -d -o NAME,ROTA,SIZE,MODEL,TYPE | sed 's/^/lsblk: /'
"$BIN/disk_tier" --dir "$dir" --blocks "${BLOCKS:-512}" --qd "${QD:-4}" \
  --write_threads "${WRITE_THREADS:-4}" --json "$OUT" "$@"
