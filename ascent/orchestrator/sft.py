"""`ascent sft`: supervised warm-start on prompt/response pairs, loss on response tokens only.

SFT reuses the policy trainer unchanged: the negative log-likelihood of the response is the `reinforce`
policy loss with advantage 1 on every response token, aggregated by `token-mean`. So packing, micro-batching,
precision, LoRA and checkpoints behave exactly as in RL, and the output is a checkpoint `ascent train` reads.
"""

from __future__ import annotations

import logging
import math
from functools import partial
from typing import Any

from ascent.config.schema import AlgorithmConfig, SFTConfig
from ascent.orchestrator import checkpointing
from ascent.orchestrator.interrupt import graceful_stop, stopped_message
from ascent.orchestrator.resume import fingerprints
from ascent.types import TrainSample

log = logging.getLogger("ascent")


def sft_samples(examples: list[Any]) -> list[TrainSample]:
    """Rendered prompt/response pairs -> TrainSamples: every response token in the loss, advantage 1."""
    return [
        TrainSample(
            prompt_ids=e.prompt_ids,
            response_ids=e.response_ids,
            loss_mask=[1] * len(e.response_ids),
            advantages=[1.0] * len(e.response_ids),
        )
        for e in examples
    ]


def _load(cfg: SFTConfig, path: str | None, tok: Any) -> list[TrainSample]:
    from ascent.data import load_rows, render_sft_examples

    if not path:
        return []
    rows = load_rows(path)
    examples = render_sft_examples(
        rows,
        tok,
        response_key=cfg.response_key,
        max_prompt_tokens=cfg.data.max_prompt_tokens,
        chat_template=cfg.data.chat_template,
    )
    return sft_samples(examples)


def run_sft(cfg: SFTConfig, resume_from: str | None = None, accept_changes: bool = False) -> dict[str, float]:
    """Fine-tune `cfg.model` on the pairs of `cfg.data`; write `<run_dir>/final` (HF format). Returns metrics."""
    from ascent.orchestrator.rundir import open_run_dir

    run_dir, lock = open_run_dir(cfg)
    try:
        with graceful_stop() as stop:
            return _sft(cfg, run_dir, stop, resume_from, accept_changes)
    finally:
        lock.release()


def _sft(cfg: SFTConfig, run_dir: Any, stop: Any, resume_from: str | None, accept: bool) -> dict[str, float]:
    from ascent.data import PromptSampler
    from ascent.models.loading import load_tokenizer, resolve_device
    from ascent.models.varlen import enable_for_training
    from ascent.orchestrator import preflight
    from ascent.orchestrator.rundir import write_config
    from ascent.tracking import MetricsLogger, Progress, setup_logging
    from ascent.trainer.policy import PolicyWorker

    setup_logging(str(run_dir), "controller")
    preflight.model_config(cfg.model.path)
    tok = load_tokenizer(cfg.model.tokenizer_path or cfg.model.path)
    preflight.check_model(cfg.model.path, tok)
    train, val = _load(cfg, cfg.data.train_path, tok), _load(cfg, cfg.data.val_path, tok)
    steps = max(1, math.ceil(cfg.epochs * len(train) / cfg.batch_size))
    what = f"epochs={cfg.epochs} ({steps} optimizer steps of batch_size={cfg.batch_size})"
    found = checkpointing.resume_state(cfg, steps, what, resume_from, accept) if cfg.resume else None
    write_config(cfg)
    algo = AlgorithmConfig(advantage="grpo", policy_loss="reinforce", loss_aggregation="token-mean")
    policy = PolicyWorker.from_config(
        model_cfg=cfg.model,
        train_cfg=cfg.train,
        algo_cfg=algo,
        total_optimizer_steps=steps,
        temperature=1.0,
        device=resolve_device("auto"),
    )
    # flash varlen on CUDA bf16/fp16 unless train.attention says otherwise
    enable_for_training(policy.model, policy.device, policy.compute_dtype, cfg.train.attention)
    sampler = PromptSampler(len(train), cfg.batch_size, seed=cfg.seed, shuffle=cfg.data.shuffle)
    start = _resume(policy, sampler, found) if found else 0
    metrics_log = MetricsLogger(str(run_dir), tensorboard=cfg.tracking.tensorboard, purge_step=start + 1)
    metrics: dict[str, float] = {}
    stop.arm()  # from here a signal waits for the end of the step and its checkpoint
    try:
        with Progress(steps, enabled=cfg.tracking.progress, start_iteration=start) as progress:
            for step in range(start + 1, steps + 1):
                mb = [train[i] for i in sampler.next_batch()]
                tokens = float(sum(len(s.response_ids) for s in mb))
                metrics = policy.update(mb, total_tokens=tokens, total_seqs=float(len(mb)))
                metrics["sft/nll"] = metrics.get("loss/policy", float("nan"))
                if val and (step == steps or (cfg.val_every and step % cfg.val_every == 0)):
                    metrics["val/nll"] = _nll(policy, val)
                metrics_log.log(metrics, step=step)
                progress.update(step, metrics)
                _checkpoint_or_stop(cfg, run_dir, step, steps, policy, tok, sampler, stop)
    finally:
        metrics_log.close()
    final = run_dir / "final"
    policy.save(str(final))  # HF weights + tokenizer (+ optimizer state, so the warm-start can be resumed)
    tok.save_pretrained(str(final))
    log.info("SFT finished: %s (train nll %.4f)", final, metrics.get("sft/nll", float("nan")))
    return metrics


def _checkpoint_or_stop(
    cfg: SFTConfig, run_dir: Any, step: int, steps: int, policy: Any, tok: Any, sampler: Any, stop: Any
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
            [partial(policy.save, optimizer=cfg.checkpoint.save_optimizer), tok.save_pretrained],
            state,
            cfg.checkpoint.keep_last,
        )
    if interrupt:
        raise stopped_message(stop.signum, "step", str(path) if path else None, step, steps)


def _resume(policy: Any, sampler: Any, found: tuple[Any, dict[str, Any]]) -> int:
    """Continue from the SFT checkpoint `resume_state` found; returns its optimizer step."""
    path, state = found
    policy.load(str(path))
    sampler.load_state_dict(state["sampler"])
    log.info("resumed SFT from %s (step %d)", path, state["iteration"])
    return int(state["iteration"])


def _nll(policy: Any, samples: list[TrainSample]) -> float:
    logprobs = policy.compute_logprobs(samples, temperature=1.0, which="policy")
    flat = [x for row in logprobs for x in row]
    return -sum(flat) / max(len(flat), 1)
