#!/bin/bash
# Decisions unchanged: `gputopo simulate -o json` less its `seconds` fields, for every policy, on
# the runs below, from the tree at REV (default: main) and from this working tree, compared
# byte for byte. Usage: tools/sim_identity.sh [REV]   (PY: the interpreter, default .venv/bin/python;
# TRACES: the traces folder, default ../shared/traces beside the checkout). Exit 1 on a difference.
set -euo pipefail
REV=${1:-main}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
TRACES=${TRACES:-$ROOT/../shared/traces}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/base"
git -C "$ROOT" archive "$REV" | tar -x -C "$WORK/base"
PHILLY=$TRACES/philly-excerpt-15k/philly_jobs_15k.csv
HELIOS=$TRACES/helios-excerpt-15k/helios_jobs_15k.csv
RUNS=(
  "default|"
  "mixed-leaf|--cluster-preset mixed-leaf"
  "gb200|--cluster-preset gb200-nvl"
  "philly|--trace $PHILLY --limit 4000"
  "philly-mixed|--trace $PHILLY --limit 4000 --cluster-preset mixed-leaf"
  "helios-gb200|--trace $HELIOS --limit 4000 --cluster-preset gb200-nvl"
  "nvl72-tree|--cluster-preset nvl72 --jobs tree --pods 1000"
  "mixed-llm-fail|--cluster-preset mixed-leaf --profile-mix llm --pods 5000 --bind-failure-rate 0.2 --reservation-ttl 5"
)
dump() {  # tree, output folder
  mkdir -p "$2"
  for run in "${RUNS[@]}"; do
    name=${run%%|*}
    # shellcheck disable=SC2086  # the arguments are words
    (cd "$1" && PYTHONPATH="$1:$1/proto" "$PY" -m gputopo simulate -o json ${run#*|}) | "$PY" -c '
import json, sys
def strip(o):
    if isinstance(o, dict):
        return {k: strip(v) for k, v in o.items() if k != "seconds"}
    return [strip(v) for v in o] if isinstance(o, list) else o
json.dump(strip(json.load(sys.stdin)), sys.stdout, indent=1, sort_keys=True)' > "$2/$name.json"
  done
}
dump "$WORK/base" "$WORK/before"
dump "$ROOT" "$WORK/after"
status=0
for f in "$WORK"/before/*.json; do
  name=$(basename "$f")
  if cmp -s "$f" "$WORK/after/$name"; then echo "same       $name"; else echo "DIFFERENT  $name"; status=1; fi
done
exit $status
