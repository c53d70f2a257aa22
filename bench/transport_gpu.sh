#!/usr/bin/env bash
# GPU evidence for the weight transports (BENCHMARKS.md, "Weight transport"): bench/publish.py on two model shapes,
# then short colocated Ray GRPO runs of the 13M arithmetic model over cuda_ipc and object_store, with their
# publish times (same run, same data). Usage (on a GPU machine with Ray installed): bash bench/transport_gpu.sh <out_dir>
set -uo pipefail
out=${1:-/tmp/transport}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 400 python3 bench/publish.py --shapes 0.5b,1.5b --transports cuda_ipc,object_store --repeats 6 \
  --json "$out/pub.json" 2>&1 | grep -v "^(raylet\|^\s*$" | tail -40
ray stop --force >/dev/null 2>&1
root=/tmp/arith
python3 -c "from ascent.models.tiny import make_tiny_checkpoint as m; m('$root/base', hidden_size=384, \
num_layers=6, num_heads=6, num_kv_heads=2, seed=0)"
python3 examples/arithmetic/make_data.py --out "$root/data" --digits 3 --sft 10 --train 5000 --val 100 >/dev/null
for transport in cuda_ipc object_store; do
  run="$root/grpo_$transport"
  timeout 200 python3 -m ascent train examples/arithmetic/grpo_gpu.yaml run_dir="$run" model.path="$root/base" \
    data.train_path="$root/data/train.jsonl" data.val_path="$root/data/val.jsonl" iterations=12 val_every=0 \
    cluster.backend=ray cluster.placement=colocated cluster.gpus_per_worker=1 cluster.cpus_per_worker=2 \
    cluster.weight_transport=$transport > "$out/train_$transport.log" 2>&1
  echo "train ($transport) rc=$?"; ray stop --force >/dev/null 2>&1
  grep -h "weight transport" "$out/train_$transport.log" | tail -1
  python3 - "$run/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])][3:]  # after the first iterations' compile and warm-up
for key in ("time/publish", "time/iteration", "rollout/logprob_diff_max"):
    values = [r[key] for r in rows if key in r]
    print(f"  {key}: median {statistics.median(values):.4f} range {min(values):.4f}-{max(values):.4f} "
          f"over {len(values)} iterations")
PY
done
