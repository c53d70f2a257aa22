#!/usr/bin/env bash
# The zoom task's learning run at Qwen2.5-VL-3B's size (random weights), in one device call (issue #28;
# examples/vision/gpu_run.py, whose help gives the time of each phase): setup, the warm start, GRPO with and
# without the tool.
#   bash examples/vision/gpu_run.sh [BUDGET_S] [gpu_run.py arguments ...]     e.g. ... 525 --place --lr 6e-5
# Device command, the measured run (BENCHMARKS.md, 2026-11-27: GRPO with the tool at two rates and without
# it, three GPUs at once after the warm start; ~7.5 minutes, gpu_run.py's budget of 490 s bounds it):
#   run(kind="nvidia-h100-x4", carry=[".whl"], timeout_s=560, command="CUDA_VISIBLE_DEVICES=0,1,2
#       bash examples/vision/gpu_run.sh 490 --place --gpus 3 --arms zoom,zoom,plain --lrs 3e-5,6e-5,3e-5")
# Two GPUs (kind "nvidia-h100-x2"): ... 490 --place --gpus 2 (with and without the tool at 3e-5).
# Needs .whl/ (installed here, no network there): pydantic, pydantic-core, annotated-types,
# typing-inspection, typing-extensions, pebble (../shared/gpu/wheels.sh, NO_RAY=1 will do) and
# llguidance-1.6.1-cp39-abi3-manylinux_2_28_x86_64.whl (3 MB: `rollout.grammar`). No torchvision: ascent's
# image codec names transformers' PIL image processor itself where AutoImageProcessor insists on it (5.17).
# Writes 4 files under $OUT (the device returns 8 at most): vision_3b.json (gpu_run.py --json),
# vision_3b.log (everything), device.txt, and runs.tar.gz (each stage's and run's metrics.jsonl,
# config.yaml and experience.db).
set -u
out=${OUT:-/tmp/out}; budget=490
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
# checkpoints of 7 GB are written and read three times: in memory where /dev/shm has room (28 s a write on
# the device's /tmp in the last run)
root=/tmp/ascent_vision
if [ "$(df --output=avail -B1G /dev/shm 2>/dev/null | tail -1)" -gt 40 ] 2>/dev/null; then root=/dev/shm/ascent_vision; fi
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
