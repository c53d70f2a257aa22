"""TRL's GRPOTrainer (no vLLM) on the vision-language workload: the same-call baseline of bench/vl_e2e.py.

    python bench/trl_vl_baseline.py --shape 3b --json trl_vl_3b.json

Same checkpoint, rows (one `--image-size` image and a short question each, as TRL's `image` column with a
conversational prompt) and coin-flip reward as bench/vl_e2e.py: `--prompts` x `--samples` completions per
optimizer step (`per_device_train_batch_size` x `gradient_accumulation_steps`), at most `--new-tokens` new
tokens, fp32 master weights with bf16 autocast (TRL's defaults), gradient checkpointing. TRL needs a
transformers processor (`AutoProcessor`), which for Qwen2.5-VL includes a video processor and so torchvision;
the script builds it from the checkpoint's tokenizer and image processor and saves it beside them.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trl_baseline as T  # noqa: E402
import vl_workload as V  # noqa: E402


def processor(model: Path) -> Any:
    """The checkpoint's Qwen2.5-VL processor (tokenizer + image processor + video processor), saved there."""
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    tok = AutoTokenizer.from_pretrained(str(model))
    proc = Qwen2_5_VLProcessor(
        image_processor=AutoImageProcessor.from_pretrained(str(model)),
        tokenizer=tok,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=tok.chat_template,
    )
    proc.save_pretrained(str(model))
    return proc


def build_trainer(args: argparse.Namespace, rows: list[dict[str, float]]) -> Any:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = V.make_checkpoint(args.root, args.shape, args.image_size, device)
    proc = processor(model)
    total = args.prompts * args.samples

    def reward(completions: list[Any], completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        return [V.W.coin(ids) for ids in completion_ids]

    config = GRPOConfig(
        output_dir=str(args.root / f"trl_vl_{args.shape}"),
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=total // args.micro_batch,
        num_generations=args.samples,
        max_completion_length=args.new_tokens,
        bf16=device == "cuda",
        learning_rate=1e-6,
        max_steps=args.warmup + args.steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        model_init_kwargs={"dtype": "float32"},
        gradient_checkpointing=True,
        remove_unused_columns=False,
        seed=0,
        disable_tqdm=True,
        use_cpu=device == "cpu",
    )
    rng = random.Random(0)
    data = [
        {
            "prompt": [
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": V.question(rng)}]}
            ],
            "image": image,
        }
        for image in V.images(max(4 * args.prompts, 64), args.image_size)
    ]
    return GRPOTrainer(
        model=str(model),
        reward_funcs=reward,
        args=config,
        train_dataset=Dataset.from_list(data),
        processing_class=proc,
        callbacks=[T.step_timer(rows)],
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(V.TEXT), default="3b")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--image-size", type=int, default=448)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--root", type=Path, default=Path("/tmp/ascent_vl"))
    ap.add_argument("--json", type=Path, default=None)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train `--warmup + --steps` optimizer steps; print and return the per-step times and peaks."""
    return T.run(parse(argv), build_trainer, "TRL VL")


if __name__ == "__main__":
    main(sys.argv[1:])
