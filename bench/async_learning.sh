#!/usr/bin/env bash
# Async against synchronous RL on the GPU learning run (BENCHMARKS.md, "Async RL learning run"): one SFT
# warm start (examples/arithmetic: 13.0M-parameter model, 3-digit addition, the full 10-epoch sft_gpu.yaml),
# then GRPO from the same checkpoint, data and seed twice on the same Ray split placement (trainer and engine
# as two actors): rollout.max_staleness=0, then =1. Prints each run's held-out accuracy curve, wall time and
# median iteration.
# Usage: [STAGE=all|warm|grpo] [GPUS_PER_WORKER=0.5] bash bench/async_learning.sh [root] [iterations] [overrides...]
#   GPUS_PER_WORKER=0.5: trainer and engine share one GPU (CUDA IPC); =1 on a 2-GPU machine: a GPU each (NCCL).
#   STAGE=warm runs only the SFT and the pick (it writes $root/warm_start); STAGE=grpo only the two GRPO runs
#   from it, so the two halves fit two 10-minute device calls on one warm machine (keep root under runs/,
#   which git ignores, so the device keeps it between calls).
set -euo pipefail
root=${1:-runs/async_learning}
iters=${2:-100}
shift 2 || shift $# || true
ex=examples/arithmetic
stage=${STAGE:-all}
gpus=${GPUS_PER_WORKER:-0.5}
if [ "$stage" != grpo ]; then
rm -rf "$root"
python3 -c "from ascent.models.tiny import make_tiny_checkpoint as m; m('$root/base', hidden_size=384, \
num_layers=6, num_heads=6, num_kv_heads=2, seed=0)"
python3 "$ex/make_data.py" --out "$root/data" --digits 3 --sft 30000 --train 50000 --val 500
python3 -m ascent sft "$ex/sft_gpu.yaml" run_dir="$root/sft" model.path="$root/base" \
  data.train_path="$root/data/sft.jsonl" ${SFT_OVERRIDES:-}
python3 "$ex/pick_warm_start.py" --sft "$root/sft" --data "$root/data/train.jsonl" --min-accuracy 0.25 \
  > "$root/warm_start"
fi
[ "$stage" = warm ] && { echo "warm start: $(cat "$root/warm_start")"; exit 0; }
warm=$(cat "$root/warm_start")
echo "GRPO starts from $warm"
for k in 0 1; do
  start=$(date +%s)
  python3 -m ascent train "$ex/grpo_gpu.yaml" run_dir="$root/grpo_s$k" model.path="$warm" iterations="$iters" \
    data.train_path="$root/data/train.jsonl" data.val_path="$root/data/val.jsonl" cluster.backend=ray \
    cluster.placement=split cluster.gpus_per_worker=$gpus cluster.cpus_per_worker=2 rollout.max_staleness=$k "$@"
  python3 - "$root/grpo_s$k/metrics.jsonl" "$start" "$k" <<'PY'
import json, statistics, sys, time
rows = [json.loads(line) for line in open(sys.argv[1])]
curve = [(r["step"], round(r["val/accuracy"], 3)) for r in rows if "val/accuracy" in r]
its = [r["time/iteration"] for r in rows if "time/iteration" in r][2:]
stale = [r["rollout/staleness_max"] for r in rows if "rollout/staleness_max" in r]
print(f"max_staleness={sys.argv[3]}: val/accuracy by iteration: {curve}")
print(f"max_staleness={sys.argv[3]}: wall {time.time() - int(sys.argv[2]):.0f} s (with start-up), "
      f"iterations 3+ {sum(its):.1f} s, median {statistics.median(its):.3f} s, "
      f"staleness max {max(stale, default=0)}")
PY
done
