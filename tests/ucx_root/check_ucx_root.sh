#!/usr/bin/env bash
# usage: check_ucx_root.sh UCX_ROOT BINARY
# Passes when BINARY loads libucp from UCX_ROOT/lib and that UCX was configured with CUDA.
set -euo pipefail
root=$(realpath "$1"); bin=$2
ucp=$(ldd "$bin" | awk '$1 ~ /^libucp\.so/ {print $3}')
[[ -n $ucp ]] || { echo "FAIL: $bin does not load libucp"; exit 1; }
[[ $(realpath "$ucp") == "$root"/lib/* ]] || { echo "FAIL: $bin loads $ucp, not one from $root/lib"; exit 1; }
info=$("$root/bin/ucx_info" -v)
echo "$info"
grep -q -- '--with-cuda' <<<"$info" || { echo "FAIL: $root was not configured --with-cuda"; exit 1; }
echo "PASS: $bin loads $ucp"
