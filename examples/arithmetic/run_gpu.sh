#!/usr/bin/env bash
# The arithmetic demo scaled up for one GPU: a 13.0M-parameter model, 3-digit addition, SFT then GRPO with the
# fast engine; GRPO starts from the first SFT checkpoint that solves >= 25% of 200 training prompts
# (pick_warm_start.py says why). Usage: bash examples/arithmetic/run_gpu.sh [root] [extra `ascent train` overrides...]
# Prints the held-out accuracy curve (greedy, 500 problems) from the GRPO run's metrics.jsonl.
set -euo pipefail
root=${1:-runs/arithmetic_gpu}
shift || true
here=$(dirname "$0")
start=$(date +%s)
rm -rf "$root/sft" "$root/grpo"  # a second run starts over (sft and train refuse to overwrite checkpoints)
python3 -c "from ascent.models.tiny import make_tiny_checkpoint as m; m('$root/base', hidden_size=384, \
num_layers=6, num_heads=6, num_kv_heads=2, seed=0)"
python3 "$here/make_data.py" --out "$root/data" --digits 3 --sft 30000 --train 50000 --val 500
python3 -m ascent sft "$here/sft_gpu.yaml" run_dir="$root/sft" model.path="$root/base" \
  data.train_path="$root/data/sft.jsonl" ${SFT_OVERRIDES:-}
warm=$(python3 "$here/pick_warm_start.py" --sft "$root/sft" --data "$root/data/train.jsonl" --min-accuracy 0.25)
echo "GRPO starts from $warm"
python3 -m ascent train "$here/grpo_gpu.yaml" run_dir="$root/grpo" model.path="$warm" \
  data.train_path="$root/data/train.jsonl" data.val_path="$root/data/val.jsonl" "$@"
python3 - "$root/grpo/metrics.jsonl" "$start" <<'PY'
import json, sys, time
rows = [json.loads(line) for line in open(sys.argv[1])]
curve = [(r["step"], round(r["val/accuracy"], 3)) for r in rows if "val/accuracy" in r]
print("val/accuracy by iteration:", curve)
print(f"wall time {time.time() - int(sys.argv[2]):.0f} s")
PY
