#!/usr/bin/env bash
# scripts/runtime-packages.sh BINARY...: the Debian/Ubuntu packages that own the shared libraries
# the binaries load (ldd), one a line, sorted: what a runtime image must install. CUDA's
# libraries under /usr/local/cuda and the driver's libcuda are left out (a CUDA runtime base
# image carries them). A library that is not found, or that no package owns, is an error.
set -euo pipefail
(($#)) || { echo "usage: $0 BINARY..." >&2; exit 2; }
libs=$(for b in "$@"; do
  ldd "$b" | awk '/=> not found/ { print "MISSING " $1; next } /=> \// { print $3 }'
done | sort -u)
if grep -q '^MISSING' <<<"$libs"; then
  echo "runtime-packages: libraries not found: $(grep '^MISSING' <<<"$libs" | cut -d' ' -f2 | tr '\n' ' ')" >&2
  exit 1
fi
pkgs=()
for lib in $libs; do
  case $lib in /usr/local/cuda*|*/libcuda.so*) continue ;; esac
  real=$(readlink -f "$lib")
  if ! owner=$(dpkg -S "$lib" 2>/dev/null) && ! owner=$(dpkg -S "$real" 2>/dev/null); then
    echo "runtime-packages: no package owns $lib" >&2
    exit 1
  fi
  pkgs+=("${owner%%:*}")
done
printf '%s\n' "${pkgs[@]}" | sort -u
