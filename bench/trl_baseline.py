"""TRL's GRPOTrainer without vLLM on the e2e workload: the same-run baseline of bench/e2e.py.

    python bench/trl_baseline.py --shape 0.5b --json trl_05b.json

Same checkpoint, prompts and reward as bench/e2e.py (bench/e2e_workload.py): 32 prompts x 8 samples per
step (`per_device_train_batch_size=16` x `gradient_accumulation_steps=16` = one optimizer step on 256
completions, generated together by transformers `generate`), 256-token prompts, exactly 512 completion
tokens (`min_new_tokens=512` suppresses EOS), fp32 master weights with bf16 autocast (TRL's default load
dtype is float32; `bf16=True`), TRL's default gradient checkpointing. Each optimizer step is timed (GPU
synchronized) with its peak memory; the first `--warmup` steps are reported apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_workload as W  # noqa: E402


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def step_timer(rows: list[dict[str, float]]) -> Any:
    """A TrainerCallback that appends {step_s, peak_allocated_gib, peak_reserved_gib} per optimizer step."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            _sync()
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            _sync()
            row = {"step_s": time.perf_counter() - self.t0}
            if torch.cuda.is_available():
                row["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
                row["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
            rows.append(row)
            print(f"trl step {state.global_step}: {json.dumps(row)}", flush=True)

    return StepTimer()


def build_trainer(args: argparse.Namespace, rows: list[dict[str, float]]) -> Any:
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    model = W.make_checkpoint(args.root, args.shape, "cuda" if torch.cuda.is_available() else "cpu")
    total = args.prompts * args.samples

    def reward(completions: list[Any], completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        return [W.coin(ids) for ids in completion_ids]

    config = GRPOConfig(
        output_dir=str(args.root / f"trl_{args.shape}"),
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=total // args.micro_batch,
        num_generations=args.samples,
        max_completion_length=args.new_tokens,
        generation_kwargs={"min_new_tokens": args.new_tokens},
        bf16=args.bf16,
        learning_rate=1e-6,
        max_steps=args.warmup + args.steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        model_init_kwargs={"dtype": "float32"},
        gradient_checkpointing=args.grad_ckpt,
        remove_unused_columns=False,
        seed=0,
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
    )
    data = Dataset.from_list(W.prompt_rows(max(4 * args.prompts, 128), args.prompt_len))
    tok = AutoTokenizer.from_pretrained(str(model))
    return GRPOTrainer(
        model=str(model),
        reward_funcs=reward,
        args=config,
        train_dataset=data,
        processing_class=tok,
        callbacks=[step_timer(rows)],
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(W.SHAPES), default="0.5b")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--micro-batch", type=int, default=16, help="per_device_train_batch_size")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--grad-ckpt", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--root", type=Path, default=Path("/tmp/ascent_e2e"))
    ap.add_argument("--json", type=Path, default=None)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train `--warmup + --steps` optimizer steps; print and return the per-step times and peaks."""
    return run(parse(argv), build_trainer, "TRL")


def run(args: argparse.Namespace, build: Any, label: str) -> dict[str, Any]:
    """Train the trainer `build(args, rows)` makes for `--warmup + --steps` optimizer steps; print (as
    `label`) and return the per-step times and peaks (also the VL baseline's body)."""
    args.root.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, float]] = []
    res = W.report_header(args)
    build(args, rows).train()
    timed = rows[args.warmup :] or rows
    step = statistics.median(r["step_s"] for r in timed)
    res.update(warmup=rows[: args.warmup], steps=timed, step_s=step)
    res["completions_per_s"] = args.prompts * args.samples / step
    res["peak_allocated_gib"] = max((r.get("peak_allocated_gib", 0.0) for r in rows), default=0.0)
    res["peak_reserved_gib"] = max((r.get("peak_reserved_gib", 0.0) for r in rows), default=0.0)
    print(
        f"{label} {args.shape}: {step:.2f} s/step (median of {len(timed)}), {res['completions_per_s']:.1f} "
        f"completions/s, peak allocated {res['peak_allocated_gib']:.1f} GiB",
        flush=True,
    )
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, default=str))
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
