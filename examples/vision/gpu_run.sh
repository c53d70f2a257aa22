#!/usr/bin/env bash
# The zoom task's learning run at Qwen2.5-VL-3B's size (random weights), in one device call (issue #28;
# examples/vision/gpu_run.py, whose help gives the time of each phase): setup, the warm start, GRPO with and
# without the tool.
#   bash examples/vision/gpu_run.sh [BUDGET_S] [gpu_run.py arguments ...]     e.g. ... 525 --place --lr 6e-5
# Device command, the --place recipe with both arms at once on two GPUs (~9 minutes; the budget of 525 s
# bounds gpu_run.py, this file adds ~15 s):
#   run(kind="nvidia-h100-x2", carry=[".whl"], timeout_s=590,
#       command="bash examples/vision/gpu_run.sh 525 --place --gpus 2")
# (or kind "nvidia-h200-x2"). Two rates of the zoom arm instead: ... --place --gpus 2 --arms zoom,zoom
# --lrs 3e-5,6e-5. One GPU (kind left out): ... --place (the arms one after the other, ~15 iterations each).
# Needs .whl/ (installed here, no network there): pydantic, pydantic-core, annotated-types,
# typing-inspection, typing-extensions, pebble (../shared/gpu/wheels.sh, NO_RAY=1 will do) and
# llguidance-1.6.1-cp39-abi3-manylinux_2_28_x86_64.whl (3 MB: `rollout.grammar`). No torchvision: ascent's
# image codec names transformers' PIL image processor itself where AutoImageProcessor insists on it (5.17).
# Writes 4 files under $OUT (the device returns 8 at most): vision_3b.json (gpu_run.py --json),
# vision_3b.log (everything), device.txt, and runs.tar.gz (each stage's and run's metrics.jsonl,
# config.yaml and experience.db).
set -u
out=${OUT:-/tmp/out}; budget=525
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
timeout $((budget + 30)) python3 examples/vision/gpu_run.py --root "$root" --json "$out/vision_3b.json" \
  --budget-s "$budget" "$@" 2>&1 | tee "$out/vision_3b.log" | grep -v "Loading weights\|Writing model\|val sample"
rc=${PIPESTATUS[0]}
keep=()
for run in "$root"/sft_* "$root"/grpo_*; do
  [ -d "$run" ] || continue
  for f in metrics.jsonl config.yaml experience.db experience.db-wal; do
    [ -f "$run/$f" ] && keep+=("$(basename "$run")/$f")
  done
done
[ ${#keep[@]} -gt 0 ] && tar -czf "$out/runs.tar.gz" -C "$root" "${keep[@]}"
echo "gpu_run rc=$rc"
