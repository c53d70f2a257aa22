#!/usr/bin/env bash
# GRPO on Reach (ascent.envs.sim.reach: step toward a target 1 or 2 cells away, 3 steps at most) from a tiny
# model made from scratch, through the real CLI with the simulators stepped in blocks of 8 inside 2 worker
# processes (rollout.source.sims_per_worker); prints return and success rate of the first and last
# iterations of each seed. A random valid policy succeeds in about 36% of episodes. About 10 minutes a seed
# on a 2-core CPU. Usage: bash bench/embodied_reach.sh [OUT] [ITERATIONS] [SEEDS...]
set -euo pipefail
out=${1:-runs/embodied_reach}
iterations=${2:-20}
shift $(( $# > 2 ? 2 : $# ))
seeds=("${@:-0 1 2}")
python examples/embodied/make_data.py "$out" >/dev/null   # the tiny model with <a0>, <a1> (CartPole's words)
python -m ascent.envs.tasks.control_task "$out/reach" --task reach --rows 64 --val 16
for seed in ${seeds[@]}; do
  python -m ascent train examples/embodied/grpo.yaml "run_dir=$out/seed$seed" "seed=$seed" \
    "iterations=$iterations" "model.path=$out/model" "data.train_path=$out/reach/rows.jsonl" \
    "rollout.stop_token_ids=$(cat "$out/stop_token_ids.json")" rollout.env_isolation=process \
    rollout.env_workers=2 \
    "rollout.source={name: env, env: gym, max_turns: 3, max_episode_tokens: 64, sims_per_worker: 8}"
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
        f"{first['env/success_rate']:.2f} -> {last['env/success_rate']:.2f}"
    )
PY
