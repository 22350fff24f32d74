#!/usr/bin/env bash
# Installs missing packages, configures and builds reshard into build/ (or $RESHARD_BUILD_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
build="${RESHARD_BUILD_DIR:-build}"
jobs="${RESHARD_JOBS:-$(nproc)}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build.configure.log" 2>&1 || {
  cat "$build.configure.log" >&2
  exit 1
}
cmake --build "$build" -j "$jobs"
