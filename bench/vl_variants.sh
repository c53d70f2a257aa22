#!/usr/bin/env bash
# Where a vision-language update's time goes: bench/vl_e2e.py with and without pieces, in one call.
#   bash bench/vl_variants.sh OUT_DIR [shape]
set -u
out=${1:?OUT_DIR}; shape=${2:-3b}
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:-}:$PWD:$PWD/bench"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/device.txt"
run() {  # name, overrides...
  local name=$1; shift
  timeout 200 python3 bench/vl_e2e.py --shape "$shape" --iterations 1 --json "$out/$name.json" "$@" 2>&1 \
    | grep "ascent VL\|error" | sed "s/^/$name: /"
}
run default
run frozen_tower model.freeze_vision_tower=true
run no_ckpt_4k model.gradient_checkpointing=false train.max_tokens_per_micro_batch=4096
