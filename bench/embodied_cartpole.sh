#!/usr/bin/env bash
# GRPO on CartPole (examples/embodied/grpo.yaml) from a tiny model made from scratch, for 3 seeds on the CPU;
# prints return, success rate and episode length of the first and last iterations of each seed (about 10 to
# 20 minutes a seed on a 2-core CPU: episodes grow as the model learns the action words).
# Usage: bash bench/embodied_cartpole.sh [OUT] [ITERATIONS]
set -euo pipefail
out=${1:-runs/embodied_bench}
iterations=${2:-20}
python examples/embodied/make_data.py "$out"
for seed in 0 1 2; do
  python -m ascent train examples/embodied/grpo.yaml "run_dir=$out/seed$seed" "seed=$seed" \
    "iterations=$iterations" "model.path=$out/model" "data.train_path=$out/data/rows.jsonl" \
    "rollout.stop_token_ids=$(cat "$out/stop_token_ids.json")"
done
python - "$out" <<'PY'
import json, sys
from pathlib import Path

for run in sorted(Path(sys.argv[1]).glob("seed*")):
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    rows = [r for r in rows if "env/success_rate" in r]
    first, last = rows[0], rows[-1]
    print(
        f"{run.name}: return {first['reward/mean']:.2f} -> {last['reward/mean']:.2f}, success "
        f"{first['env/success_rate']:.2f} -> {last['env/success_rate']:.2f}, length "
        f"{first['env/episode_length']:.1f} -> {last['env/episode_length']:.1f}"
    )
PY
