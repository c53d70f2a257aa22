#!/usr/bin/env bash
# Same-call before/after timing of a loop rework (BENCHMARKS.md, "The loop rework of issue #12 costs nothing per
# iteration"): bench/e2e.py on the 0.5B shape, alternating the tree in <before_dir> and this one.
# Usage (on a GPU machine): bash bench/rework_gpu.sh <before_dir> <out_dir> [rounds]
set -uo pipefail
before=$1; out=$2; rounds=${3:-2}
here=$(pwd)
for r in $(seq "$rounds"); do
  for side in before after; do
    dir=$here; [ "$side" = before ] && dir=$before
    (cd "$dir" && PYTHONPATH="${SITE:-/tmp/site}:$dir" timeout 200 python3 bench/e2e.py --shape 0.5b --iterations 4 \
       --root /tmp/e2e_root --json "$out/${side}_$r.json" > "$out/${side}_$r.log" 2>&1)
    echo "$side round $r rc=$?"; grep -iE "median|completions/s" "$out/${side}_$r.log" | tail -3
  done
done
