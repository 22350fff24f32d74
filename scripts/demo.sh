#!/usr/bin/env bash
# Quick-start command 1: install what is missing, build, and run the main job on the example
# specs with a readable report.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh >/dev/null
bin="${RESHARD_BUILD_DIR:-build}/bin/reshard"
for spec in examples/specs/*.json; do
  echo "=== $spec"
  "$bin" plan "$spec" --verify --explain
  echo
done
