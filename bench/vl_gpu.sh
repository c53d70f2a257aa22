#!/usr/bin/env bash
# The vision-language GRPO iteration on the GPU in one call (BENCHMARKS.md, issue #28): an older ascent tree
# (optional), this tree's ascent, then TRL's, on the same workload:
#   bash bench/vl_gpu.sh OUT_DIR [shape] [seconds per arm] [OLD_TREE]
# OLD_TREE: a directory holding another version's ascent/ and bench/ (e.g. `git archive <rev> ascent bench |
# tar -x -C DIR`), run first, for a same-call old/new comparison. VL_ARGS: extra arguments for every arm
# (e.g. "--prompts 8 --new-tokens 128"); ASCENT_ARGS / TRL_ARGS: for the ascent arms / the TRL arm only.
# Needs .whl/ (../shared/gpu/wheels.sh llguidance trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19,
# plus torchvision matching the machine's torch: TRL's Qwen2.5-VL processor includes a video processor).
set -u
out=${1:?OUT_DIR}; shape=${2:-3b}; limit=${3:-270}; old=${4:-}
mkdir -p "$out"
base=${PYTHONPATH:-}
export PYTHONUNBUFFERED=1 PYTHONPATH="$base:$PWD:$PWD/bench"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/device.txt"
python3 -c "import torch, transformers, torchvision; print(torch.__version__, transformers.__version__, torchvision.__version__)" \
  2>&1 | tail -1 | tee -a "$out/device.txt"
quiet() { grep -v "Loading weights\|Writing model" | tail -25; }
if [ -n "$old" ]; then
  (cd "$old" && PYTHONPATH="$base:$PWD:$PWD/bench" timeout "$limit" python3 bench/vl_e2e.py --shape "$shape" \
    --json "$out/vl_old_$shape.json" ${VL_ARGS:-} ${ASCENT_ARGS:-} checkpoint.save_optimizer=false 2>&1 | sed 's/^ascent VL/old ascent VL/' | quiet)
fi
rm -rf /tmp/ascent_vl/run_*  # arms write final checkpoints (optimizer state off: ~45 GB at 3B filled the disk once)
timeout "$limit" python3 bench/vl_e2e.py --shape "$shape" --json "$out/vl_$shape.json" ${VL_ARGS:-} ${ASCENT_ARGS:-} \
  checkpoint.save_optimizer=false 2>&1 | quiet
rm -rf /tmp/ascent_vl/run_*
timeout "$limit" python3 bench/trl_vl_baseline.py --shape "$shape" --json "$out/trl_vl_$shape.json" ${VL_ARGS:-} ${TRL_ARGS:-} 2>&1 | quiet
