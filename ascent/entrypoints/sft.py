"""`ascent sft`: supervised warm-start on prompt/response pairs, loss on response tokens only.

SFT reuses the policy trainer unchanged: the negative log-likelihood of the response is the `reinforce`
policy loss with advantage 1 on every response token, aggregated by `token-mean`. So packing, micro-batching,
precision, LoRA and checkpoints behave exactly as in RL, and the output is a checkpoint `ascent train` reads.
The trainer is the RL loop's trainer worker group: `cluster.num_trainer_workers=N` on Ray (each rank
`cluster.gpus_per_worker` GPUs) splits every batch over N data-parallel ranks, FSDP2-sharded with
`train.sharding=fsdp`; the default is one inline rank.
"""

from __future__ import annotations

import logging
import math
import time
from functools import partial
from typing import Any

from ascent.cluster import make_worker_group
from ascent.cluster.base import WorkerGroup
from ascent.config.schema import SFTConfig
from ascent.data import PromptSampler, image_codec, sft_examples_from_config
from ascent.data.templates import set_chat_template
from ascent.messages import TrainSample
from ascent.models.loading import load_tokenizer
from ascent.orchestrator import batch as B
from ascent.orchestrator import checkpointing, preflight
from ascent.orchestrator.interrupt import STOPS, graceful_stop, stopped_message
from ascent.orchestrator.resume import fingerprints
from ascent.orchestrator.rundir import open_run_dir, write_config
from ascent.orchestrator.specs import policy_trainer_spec
from ascent.orchestrator.workers import TrainerWorker
from ascent.tracking import Metrics, Progress, RunStarted, open_tracking, setup_logging, tracked_run
from ascent.trainer.loss import LossSettings, minibatch_totals
from ascent.trainer.settings import TrainerSpec

log = logging.getLogger("ascent")


def sft_samples(examples: list[Any]) -> list[TrainSample]:
    """Rendered pairs or conversations -> TrainSamples: response tokens in the loss (a conversation's
    assistant turns only), advantage 1."""
    return [
        TrainSample(
            prompt_ids=e.prompt_ids,
            response_ids=e.response_ids,
            loss_mask=e.loss_mask or [1] * len(e.response_ids),
            advantages=[1.0] * len(e.response_ids),
            images=e.images,
        )
        for e in examples
    ]


def _load(cfg: SFTConfig, split: str, tok: Any) -> list[TrainSample]:
    """The `split` ("train" or "val") pairs of `cfg.data` as `sft_examples_from_config` reads them, as
    `ascent train` reads its prompts: `data.processors` on the training rows, `data.max_val_prompts` on the
    validation rows, prompts over `data.max_prompt_tokens` dropped, cut (`data.truncation_side`) or refused
    as `data.overlong_prompts` says. No file: no pairs. A bad row's error names the setting, the file and the
    row (`data.train_path=x.jsonl row 3: ...`)."""
    m = cfg.model
    path = cfg.data.train_path if split == "train" else cfg.data.val_path
    if not path:
        return []
    field = "model.tokenizer_path" if m.tokenizer_path else "model.path"
    codec = image_codec(m.path, m.min_pixels, m.max_pixels, tokenizer=tok, tokenizer_field=field)
    examples, report = sft_examples_from_config(cfg, tok, split, codec=codec)
    if report.dropped or report.truncated:
        log.warning("data.%s_path=%s: SFT pairs: %s", split, path, report.summary())
    return sft_samples(examples)


def run_sft(cfg: SFTConfig, resume_from: str | None = None, accept_changes: bool = False) -> dict[str, float]:
    """Fine-tune `cfg.model` on the pairs of `cfg.data`; write `<run_dir>/final` (HF format). Returns
    metrics."""

    run_dir, lock = open_run_dir(cfg)
    try:
        with graceful_stop() as stop:
            return _sft(cfg, run_dir, stop, resume_from, accept_changes)
    finally:
        lock.release()


def _sft(cfg: SFTConfig, run_dir: Any, stop: Any, resume_from: str | None, accept: bool) -> dict[str, float]:
    setup_logging(str(run_dir), "controller", cfg.tracking.log_level)
    preflight.model_config(cfg.model.path)
    tok = set_chat_template(
        load_tokenizer(cfg.model.tokenizer_path or cfg.model.path), cfg.model.chat_template
    )
    preflight.check_model(cfg.model.path, tok)
    train, val = _load(cfg, "train", tok), _load(cfg, "val", tok)
    steps = max(1, math.ceil(cfg.epochs * len(train) / cfg.batch_size))
    what = f"epochs={cfg.epochs} ({steps} optimizer steps of batch_size={cfg.batch_size})"
    found = checkpointing.resume_state(cfg, steps, what, resume_from, accept) if cfg.resume else None
    config = cfg.model_dump(mode="json")
    started = RunStarted(
        str(run_dir), "sft", config, steps, resume_step=int(found[1]["iteration"]) if found else 0
    )
    # status.json says "running" from here, and how the run ended however it ends
    with tracked_run(open_tracking(cfg.tracking, run_dir, config), started, STOPS) as bus:
        write_config(cfg)
        trainer = _trainer_group(cfg, steps)
        try:
            return _train(cfg, run_dir, stop, trainer, train, val, tok, steps, found, bus)
        finally:
            trainer.shutdown()


def trainer_spec(cfg: SFTConfig, steps: int) -> TrainerSpec:
    """SFT's own trainer spec: the policy trainer with the `reinforce` loss aggregated by `token-mean` (with
    advantage 1, the response's negative log-likelihood), no reference, temperature 1."""
    return policy_trainer_spec(
        cfg.model,
        cfg.train,
        cfg.cluster.device,
        steps,
        loss=LossSettings(policy_loss="reinforce", loss_aggregation="token-mean"),
        temperature=1.0,
        need_reference=False,
    )


def _trainer_group(cfg: SFTConfig, steps: int) -> WorkerGroup[TrainerWorker]:
    """The trainer ranks (inline: one, in this process; Ray: `cluster.num_trainer_workers`)."""
    c = cfg.cluster
    if c.backend == "ray":
        from ascent.cluster import init_ray  # deferred: it imports Ray, which an inline run does without

        init_ray(c.address, c.num_cpus, temp_dir=c.ray_temp_dir)
    spec = trainer_spec(cfg, steps)
    return make_worker_group(
        TrainerWorker,
        num_workers=c.num_trainer_workers,
        backend=c.backend,
        name="trainer",
        init_kwargs={"spec": spec, "seed": cfg.seed, "run_dir": cfg.run_dir},
        run_dir=cfg.run_dir,
        num_gpus_per_worker=c.gpus_per_worker,
        num_cpus_per_worker=c.cpus_per_worker,
        timeout_s=c.worker_timeout_s,
        log_level=cfg.tracking.log_level,
    )


def _train(
    cfg: SFTConfig,
    run_dir: Any,
    stop: Any,
    trainer: WorkerGroup[TrainerWorker],
    train: list[TrainSample],
    val: list[TrainSample],
    tok: Any,
    steps: int,
    found: Any,
    bus: Any,
) -> dict[str, float]:
    """The SFT steps: each batch split over the ranks, its metrics on the tracking `bus`, a checkpoint when
    due, the final weights at the end."""

    sampler = PromptSampler(len(train), cfg.batch_size, seed=cfg.seed, shuffle=cfg.data.shuffle)
    start = _resume(trainer, sampler, found) if found else 0
    metrics: dict[str, float] = {}
    stop.arm()  # from here a signal waits for the end of the step and its checkpoint
    with Progress(steps, enabled=cfg.tracking.progress, start_iteration=start) as progress:
        for step in range(start + 1, steps + 1):
            t0 = time.perf_counter()
            mb = [train[i] for i in sampler.next_batch()]
            metrics = sft_step(trainer, mb)
            metrics |= _pace(mb, time.perf_counter() - t0)
            if val and (step == steps or (cfg.val_every and step % cfg.val_every == 0)):
                metrics["val/nll"] = _nll(trainer, val)
            bus.publish(Metrics.of(step, metrics))
            progress.update(step, metrics)
            _checkpoint_or_stop(cfg, run_dir, step, steps, trainer, tok, sampler, stop)
    final = run_dir / "final"
    # HF weights + tokenizer (+ optimizer state, so the warm-start can be resumed, unless
    # checkpoint.save_optimizer=false: a 3B model's AdamW state is ~27 GB more to write)
    save = partial(_save, trainer, optimizer=cfg.checkpoint.save_optimizer, hf_weights=True)
    checkpointing.write_whole(final, [save, tok.save_pretrained])  # a kill mid-save leaves no half of it
    log.info("SFT finished: %s (train nll %.4f)", final, metrics.get("sft/nll", float("nan")))
    return metrics


def sft_step(trainer: WorkerGroup[TrainerWorker], mb: list[TrainSample]) -> dict[str, float]:
    """One optimizer step on the batch `mb`, split over the ranks -> its metrics.

    The loss is the batch's summed nll over its loss-mask tokens divided by ALL its response tokens (a
    conversation's tool results and image pads included): the scale the recorded runs and the conversation
    warm starts of the tests were tuned with (normalising by the loss-mask tokens instead trains a different
    model: tests/integration/test_env_learns.py's warm start then no longer guesses). `sft/nll` is the nll
    per loss-mask token, the model's own turns (the loss rescaled): tool and image tokens, which are not the
    model's to predict, never dilute it (issue #28: a zoom demonstration's 64 such tokens made 0.29 nats
    per model token read 0.039)."""
    tokens = float(sum(len(s.response_ids) for s in mb))
    mask_tokens, seqs = minibatch_totals(mb)
    shards = B.shard(mb, trainer.num_workers)
    results = trainer.call_split(TrainerWorker.update, shards, total_tokens=tokens, total_seqs=seqs)
    metrics = {k: sum(r[k] for r in results) / len(results) for k in results[0]}
    metrics["sft/nll"] = metrics.get("loss/policy", float("nan")) * tokens / max(mask_tokens, 1.0)
    return metrics


def _pace(batch: list[TrainSample], seconds: float) -> dict[str, float]:
    """The step's time and tokens (prompt and response) per second: the progress line's throughput."""
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in batch)
    return {"time/step": seconds, "perf/tokens_per_s": tokens / max(seconds, 1e-9)}


def _checkpoint_or_stop(
    cfg: SFTConfig, run_dir: Any, step: int, steps: int, trainer: Any, tok: Any, sampler: Any, stop: Any
) -> None:
    """Checkpoint every `checkpoint.every` steps (and on a signal with `checkpoint.on_interrupt`); obey it."""
    interrupt = stop.requested and step < steps
    due = cfg.checkpoint.every and step % cfg.checkpoint.every == 0 and step < steps
    path = None
    if due or (interrupt and cfg.checkpoint.on_interrupt):
        state = {
            "sampler": sampler.state_dict(),
            "config": cfg.model_dump(mode="json"),
            "fingerprints": fingerprints(cfg.model_dump(mode="json")),
        }
        path = checkpointing.commit(
            run_dir,
            step,
            [
                partial(
                    _save,
                    trainer,
                    optimizer=cfg.checkpoint.save_optimizer,
                    hf_weights=cfg.checkpoint.hf_weights == "every",
                ),
                tok.save_pretrained,
            ],
            state,
            cfg.checkpoint.keep_last,
        )
    if interrupt:
        raise stopped_message(stop.signum, "step", str(path) if path else None, step, steps)


def _save(trainer: WorkerGroup[TrainerWorker], directory: str, optimizer: bool, hf_weights: bool) -> None:
    trainer.call(TrainerWorker.save, directory, optimizer, hf_weights)


def _resume(trainer: WorkerGroup[TrainerWorker], sampler: Any, found: tuple[Any, dict[str, Any]]) -> int:
    """Continue from the SFT checkpoint `resume_state` found; returns its optimizer step."""
    path, state = found
    trainer.call(TrainerWorker.load, str(path))
    sampler.load_state_dict(state["sampler"])
    log.info("resumed SFT from %s (step %d)", path, state["iteration"])
    return int(state["iteration"])


def _nll(trainer: WorkerGroup[TrainerWorker], samples: list[TrainSample]) -> float:
    """Mean negative log-likelihood per loss-mask token (a conversation's model turns), the samples spread
    over the ranks."""
    shards = B.shard(samples, trainer.num_workers)
    logprobs = trainer.call_split(TrainerWorker.compute_logprobs, shards, temperature=1.0, which="policy")
    rows = [row for part in logprobs for row in part]  # shards are contiguous: the samples' order
    return masked_nll(rows, [s.loss_mask for s in samples])


def masked_nll(logprobs: list[list[float]], masks: list[list[int]]) -> float:
    """Per-sample response logprobs and loss masks -> the mean negative log-likelihood over the mask-1
    tokens (tool results and image tokens of a conversation are not the model's to predict)."""
    total = sum(
        -lp * m for row, mask in zip(logprobs, masks, strict=True) for lp, m in zip(row, mask, strict=True)
    )
    return total / max(sum(sum(mask) for mask in masks), 1)
