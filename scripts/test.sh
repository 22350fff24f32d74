#!/usr/bin/env bash
# Quick-start command 2: install what is missing, build, and run every test with ctest.
# Tests labelled netns need root; gpu tests skip without a device. Fails when no test ran.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
build="${RESHARD_BUILD_DIR:-build}"
cd "$build"
ctest --output-on-failure --no-tests=error -j "${RESHARD_TEST_JOBS:-2}" --timeout 600 "$@"
