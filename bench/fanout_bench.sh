#!/usr/bin/env bash
# Fan-out benchmark (issue 5): with emulated NICs (one network namespace and one tc-shaped veth
# per rank; the ranks of a domain still share the host's memory), the median refit time of
#   ours              domain-aware plan: each piece crosses the network once per domain, then the
#                     host fan-out backend copies it to the domain's other replicas as it lands
#   naive p2p         every destination rank receives its own tile over the network
#   gather-broadcast  whole tensors gathered on one trainer and broadcast
# executed by the same engine in the same processes, interleaved (`reshard bench`), and
#   ours, fan-out by the engine   the same plan with its fan-out copies put over the network
#                                 (`reshard run --fanout engine` vs `--fanout auto`)
# Prints figures; never fails on speed. Needs root for network namespaces.
#
#   bench/fanout_bench.sh [BUILD_DIR] [RATE] [ITERS]     defaults: build, 50mbit, 7
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$here/build}"
rate="${2:-50mbit}"
iters="${3:-7}"
reshard="$build/bin/reshard"
[ -x "$reshard" ] || { echo "build the reshard target first ($reshard missing)" >&2; exit 2; }

field() {  # field JSON KEY
  python3 -c 'import json,sys; v=json.loads(sys.argv[1]).get(sys.argv[2]); print("null" if v is None else v)' "$1" "$2"
}

for spec in tp4-to-tp2dp2 eight-to-tp2dp4; do
  path="$here/tests/nvlink/specs/$spec.json"
  echo "== $spec, emulated NIC $rate per rank, $iters iterations"
  b=$("$reshard" bench "$path" --iters "$iters" --emulate-nic "$rate" --json 2>/dev/null | tail -1)
  echo "reshard bench (interleaved, same processes):"
  echo "  ours             $(field "$b" ours_ms) ms"
  echo "  naive p2p        $(field "$b" naive_p2p_ms) ms   ($(field "$b" naive_p2p_over_ours)x ours)"
  echo "  gather-broadcast $(field "$b" gather_broadcast_ms) ms   ($(field "$b" gather_broadcast_over_ours)x ours)"
  a=$("$reshard" run "$path" --iters "$iters" --emulate-nic "$rate" --fanout auto --json 2>/dev/null | tail -1)
  e=$("$reshard" run "$path" --iters "$iters" --emulate-nic "$rate" --fanout engine --json 2>/dev/null | tail -1)
  echo "reshard run, same plan:"
  echo "  fan-out layer    median $(field "$a" median_ms) ms, bytes_network $(field "$a" bytes_network), bytes_fanout $(field "$a" bytes_fanout), hidden under the domain's network stage $(field "$a" fanout_domain_hidden_fraction) (own: $(field "$a" fanout_hidden_fraction)), lower bound $(field "$a" lower_bound_ms) ms"
  echo "  engine fan-out   median $(field "$e" median_ms) ms, bytes_network $(field "$e" bytes_network)"
done
