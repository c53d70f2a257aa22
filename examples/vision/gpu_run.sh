#!/usr/bin/env bash
# The zoom task's learning run at Qwen2.5-VL-3B's size (random weights) on one GPU, in one device call
# (issue #28; examples/vision/gpu_run.py): setup, stage 1 of the warm start, GRPO with and without the tool.
#   bash examples/vision/gpu_run.sh [BUDGET_S] [gpu_run.py arguments ...]     e.g. ... 450 --lr 5e-5 --kl 0.01
# Device command (one H100; pass carry [".whl"]; ~8.5 minutes at the default budget of 450 s):
#   bash examples/vision/gpu_run.sh
# Needs .whl/ (installed here, no network there): pydantic, pydantic-core, annotated-types,
# typing-inspection, typing-extensions, pebble (../shared/gpu/wheels.sh, NO_RAY=1 will do) and
# llguidance-1.6.1-cp39-abi3-manylinux_2_28_x86_64.whl (3 MB: `rollout.grammar`). No torchvision: ascent's
# image codec names transformers' PIL image processor itself where AutoImageProcessor insists on it (5.17).
# Writes under $OUT: vision_3b.json (gpu_run.py --json), vision_3b.log (everything), device.txt, and each
# run's metrics.jsonl and config.yaml under runs/.
set -u
out=${OUT:-/tmp/out}; budget=450
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then budget=$1; shift; fi
mkdir -p "$out"
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:${PYTHONPATH:-}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/device.txt"
df -h /tmp | tail -1 | tee -a "$out/device.txt"
if ! python3 -c "import torch, transformers, llguidance, PIL, pydantic, pebble
import ascent.cli, ascent.envs.image_env, ascent.rollout.constraints
print('torch', torch.__version__, 'transformers', transformers.__version__)" >> "$out/device.txt" 2>&1; then
  tail -5 "$out/device.txt"; echo "a module is missing: see the wheels this file's head names"; exit 1
fi
tail -1 "$out/device.txt"
root=/tmp/ascent_vision
rm -rf "$root"
timeout $((budget + 120)) python3 examples/vision/gpu_run.py --root "$root" --json "$out/vision_3b.json" \
  --budget-s "$budget" "$@" 2>&1 | tee "$out/vision_3b.log" | grep -v "Loading weights\|Writing model\|val sample"
rc=${PIPESTATUS[0]}
for run in "$root"/sft_read "$root"/turns_*; do
  [ -d "$run" ] || continue
  mkdir -p "$out/runs/$(basename "$run")"
  cp "$run"/metrics.jsonl "$run"/config.yaml "$out/runs/$(basename "$run")/" 2>/dev/null
done
echo "gpu_run rc=$rc"
