#!/usr/bin/env bash
# GRPO with a continuous action head (model.action_head) on ReachContinuous (ascent.envs.sim.reach: the
# target 1 to the left or right; each step earns the distance closed, reaching it 1 more) from a tiny model
# made from scratch, through the real CLI (examples/embodied/action_head.yaml); prints return and success
# rate of the first and last 3 iterations of each seed; the rows give the state alone (make_data.py:
# `instructions: false`), 16 prompts x 4 samples per iteration, 2 epochs. Usage:
#   bash bench/embodied_action_head.sh [OUT] [ITERATIONS] [SEEDS...]
set -euo pipefail
out=${1:-runs/embodied_action_head}
iterations=${2:-20}
shift $(( $# > 2 ? 2 : $# ))
seeds=("${@:-0 1 2}")
python examples/embodied/make_data.py "$out" --continuous >/dev/null
for seed in ${seeds[@]}; do
  python -m ascent train examples/embodied/action_head.yaml "run_dir=$out/seed$seed" "seed=$seed" \
    "iterations=$iterations" "model.path=$out/model" "data.train_path=$out/data/rows.jsonl" \
    rollout.prompts_per_step=16 rollout.samples_per_prompt=4 train.trajectories_per_update=32 \
    train.epochs_per_rollout=2 >/dev/null
done
python - "$out" <<'PY'
import json, sys
from pathlib import Path

for run in sorted(Path(sys.argv[1]).glob("seed*")):
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    rows = [r for r in rows if "env/success_rate" in r]
    mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)
    first, last = rows[:3], rows[-3:]
    print(
        f"{run.name}: return {mean(first, 'reward/mean'):.2f} -> {mean(last, 'reward/mean'):.2f}, success "
        f"{mean(first, 'env/success_rate'):.2f} -> {mean(last, 'env/success_rate'):.2f}"
    )
PY
