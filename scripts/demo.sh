#!/usr/bin/env bash
# Quick-start command 1 (the main job): install what is missing, build, then refit the example
# specs for real between local processes (one process per rank, UCX puts over shared memory,
# intra-domain fan-out), verifying every destination element after every refit.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh >/dev/null
bin="${RESHARD_BUILD_DIR:-build}/bin/reshard"

echo "### What the planner decides for trainer TP4 -> inference TP2 x DP2 in one domain"
"$bin" plan examples/specs/fig3-tp4-to-tp2dp2.json --verify --explain
echo
for spec in examples/specs/*.json; do
  echo "### Real refits between local processes: $spec"
  "$bin" run "$spec" --iters 5
  echo
done
