"""Weight publication across processes: a trainer rank and a rollout replica as Ray actors, each transport
timed.

    python bench/publish.py --shapes 0.5b,1.5b --transports cuda_ipc,object_store --repeats 6 --json pub.json

Builds the worker groups exactly as `ascent train` does (`setup.build_worker_groups`, so the transport's
rendezvous is the real one), then publishes the trainer's weights `--repeats` times with the loop's own
`publish_weights`. Before every publication the replica releases its weights (`sleep(release_weights=True)`,
as the colocated loop does), so a publication that missed a tensor fails the next generate call. After the
last one the replica decodes one greedy request; its tokens must be the same for every transport (same
weights in, same tokens out). Reports per shape and transport: seconds per publication (median, range over
the repeats after the first), the bytes the trainer holds, and the group start-up time. Random-weight
Qwen2.5 shapes (bench/e2e_workload.py), written once under --root.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_workload as W  # noqa: E402


def config(args: argparse.Namespace, model: Path, data: Path, transport: str) -> Any:
    from ascent.config.schema import RunConfig

    return RunConfig.model_validate(
        {
            "run_dir": str(Path(args.root) / f"run_{model.name}_{transport}"),
            "iterations": 1,
            "model": {"path": str(model), "dtype": "bf16"},
            "data": {"train_path": str(data), "max_prompt_tokens": 64, "chat_template": False},
            "rollout": {
                "engine": "fast" if args.device == "cuda" else "reference",
                "prompts_per_step": 2,
                "samples_per_prompt": 2,
                "max_new_tokens": 16,
                **({"gpu_memory_fraction": args.engine_fraction} if args.device == "cuda" else {}),
            },
            "reward": {"fn": "exact_match", "isolation": "inline"},
            "train": {"trajectories_per_update": 4, "max_tokens_per_micro_batch": 4096},
            "cluster": {
                "backend": "ray",
                "placement": args.placement,
                "gpus_per_worker": args.gpus_per_worker if args.device == "cuda" else 0,
                "cpus_per_worker": args.cpus_per_worker,
                "weight_transport": transport,
                "weight_bucket_mb": args.bucket_mb,
                "device": args.device,
            },
            "tracking": {"tensorboard": False, "progress": False},
        }
    )


def measure(args: argparse.Namespace, model: Path, data: Path, transport: str) -> dict[str, Any]:
    from ascent.messages import GenerationRequest, SamplingParams
    from ascent.orchestrator import setup
    from ascent.orchestrator.workers import RolloutWorker

    cfg = config(args, model, data, transport)
    t0 = time.perf_counter()
    groups = setup.build_worker_groups(cfg)
    start_s = time.perf_counter() - t0
    publisher = groups.publisher
    assert publisher is not None  # build_worker_groups sets it
    try:
        seconds = []
        for version in range(args.repeats):
            groups.rollout.call(RolloutWorker.sleep, release_weights=True)
            t0 = time.perf_counter()  # what `loop.publish_weights` times
            publisher.publish(version)
            seconds.append(time.perf_counter() - t0)
            groups.rollout.call(RolloutWorker.wake)
        request = GenerationRequest(list(range(3, 35)), SamplingParams(temperature=0.0, max_new_tokens=24))
        tokens = groups.rollout.call(RolloutWorker.generate, [request])[0].generations[0][0].token_ids
    finally:
        groups.shutdown()
    timed = seconds[1:] or seconds
    return {
        "transport": publisher.name,
        "publish_s_median": statistics.median(timed),
        "publish_s_min": min(timed),
        "publish_s_max": max(timed),
        "first_s": seconds[0],
        "group_start_s": start_s,
        "greedy_tokens": tokens,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="0.5b,1.5b")
    p.add_argument("--transports", default="cuda_ipc,object_store")
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--placement", default="colocated", choices=["colocated", "split"])
    p.add_argument("--gpus-per-worker", type=float, default=1.0)
    p.add_argument("--engine-fraction", type=float, default=0.3)
    p.add_argument("--bucket-mb", type=int, default=512)
    p.add_argument("--cpus-per-worker", type=float, default=2.0)
    p.add_argument("--root", default="/tmp/ascent_bench_publish")
    p.add_argument(
        "--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a smoke test (reference engine)"
    )
    p.add_argument("--json", default=None)
    args = p.parse_args()

    from ascent.cluster import init_ray

    init_ray(None, None, log_to_driver=False)
    Path(args.root).mkdir(parents=True, exist_ok=True)
    data = W.write_prompts(args.root, 16, 32)
    results: list[dict[str, Any]] = []
    for shape in args.shapes.split(","):
        model = W.make_checkpoint(args.root, shape, args.device)
        for transport in args.transports.split(","):
            row = {"shape": shape, "params": W.num_params(shape), **measure(args, model, data, transport)}
            results.append(row)
            print(json.dumps(row), flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=1))
        same = {tuple(r["greedy_tokens"]) for r in results if r["shape"] == shape}
        print(f"{shape}: greedy tokens equal across transports: {len(same) == 1}", flush=True)


if __name__ == "__main__":
    main()
