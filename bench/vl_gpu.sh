#!/usr/bin/env bash
# The vision-language GRPO iteration on the GPU, ours then TRL's, in one call (BENCHMARKS.md, issue #28):
#   bash bench/vl_gpu.sh OUT_DIR [shape] [seconds per arm]
# Needs .whl/ (../shared/gpu/wheels.sh llguidance trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19,
# plus torchvision matching the machine's torch: TRL's Qwen2.5-VL processor includes a video processor).
set -u
out=${1:?OUT_DIR}; shape=${2:-3b}; limit=${3:-270}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:-}:$PWD:$PWD/bench"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/device.txt"
python3 -c "import torch, transformers, torchvision; print(torch.__version__, transformers.__version__, torchvision.__version__)" \
  2>&1 | tail -1 | tee -a "$out/device.txt"
timeout "$limit" python3 bench/vl_e2e.py --shape "$shape" --json "$out/vl_$shape.json" 2>&1 | grep -v "Loading weights\|Writing model" | tail -25
timeout "$limit" python3 bench/trl_vl_baseline.py --shape "$shape" --json "$out/trl_vl_$shape.json" 2>&1 | grep -v "Loading weights\|Writing model" | tail -25
