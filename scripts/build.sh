#!/usr/bin/env bash
# Configures and builds into ${KVSTREAM_BUILD_DIR:-build}. Extra args go to cmake.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVSTREAM_BUILD_DIR:-$root/build}
jobs=${KVSTREAM_JOBS:-$(nproc)}
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-RelWithDebInfo} "$@"
cmake --build "$build" -j "$jobs"
