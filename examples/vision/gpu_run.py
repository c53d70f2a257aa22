"""The zoom task's learning run at a real model size on one GPU, in one command (issue #28).

    python examples/vision/gpu_run.py --json OUT/vision_3b.json          # one H100, ~8 minutes
    python examples/vision/gpu_run.py --shape tiny --rows 64 --iterations 3 --budget-s 600   # CPU check

The `run_comparison.py --turns` recipe at Qwen2.5-VL-3B's dimensions (random weights, bf16, the tiny
setup's tokenizer with the task's texts as whole tokens and its 4-token pixel budget, so the task is the
same): `make_setup.py --shape 3b` on the GPU, stage 1 of the warm start (`sft_read.yaml`: the pattern word
read from the zoomed view; its loss printed per step), then per seed GRPO with one grammar a turn
(`grpo_turns.yaml`) WITH the zoom tool (`zoom_qa`) and WITHOUT it (`image_qa`, the word alone). Each is a
real CLI call (echoed). Recorded, as JSON (`--json`, rewritten after every phase) and a table: held-out
greedy accuracy at the start, every `--val-every` iterations and at the end; per window of `--window`
iterations the sampled episodes' right-zoom rate (the zoom into the asked quarter; chance 0.25) and mean
reward; each phase's wall time and the GPU's peak memory in use (nvidia-smi memory.used, polled every 2 s:
the whole device, CUDA context and allocator cache included).

`--budget-s` bounds the whole command: the setup and stage 1 come first (stage 1 is stopped once
`--sft-share` of the budget has passed, its checkpoint then the start), the GRPO runs share what is left. A GRPO run
stops (SIGTERM: it ends its iteration and writes a checkpoint, `checkpoint.on_interrupt`) right after a
validation when the next one would not fit its share, so its last accuracy is a validated one. Every knob
of the recipe is a flag or a `key=value` override for both stages' configs (`--sft-set` / `--grpo-set`
for one stage only).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent  # the repository: its ascent for every subprocess
EXIT_GRACE_S = 90.0  # after SIGTERM: one iteration plus a 3B checkpoint (fp32 master weights, ~14 GB)
EXIT_RESERVE_S = 30.0  # a GRPO run's share less this is its deadline: stopping takes an iteration and a save
BOXES = {  # the zoom call's box for each quarter (make_setup.WORDS), to score where an episode zoomed
    "top-left": "0.0, 0.0, 0.5, 0.5",
    "top-right": "0.5, 0.0, 1.0, 0.5",
    "bottom-left": "0.0, 0.5, 0.5, 1.0",
    "bottom-right": "0.5, 0.5, 1.0, 1.0",
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=["3b", "tiny"], default="3b", help="the checkpoint's dimensions")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda for 3b, cpu for tiny)")
    p.add_argument("--root", type=Path, default=Path("/tmp/ascent_vision"), help="model, data and runs")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--budget-s", type=float, default=480.0, help="wall-clock bound of the whole command")
    p.add_argument("--sft-share", type=float, default=0.4, help="most of the budget setup + stage 1 may use")
    p.add_argument("--rows", type=int, default=2048, help="training questions (stage 1's demonstrations)")
    p.add_argument("--seeds", type=int, default=1, help="GRPO seeds per arm")
    p.add_argument("--arms", default="zoom,plain", help="zoom (with the tool), plain (without), or both")
    # Width scaling of the tiny recipe's rates (hidden 64 -> 2048, 32x: lr/32, as for muP's hidden
    # matrices): stage 1 5e-3 -> 1.5e-4 (with warm-up), GRPO 1e-3 -> 3e-5.
    p.add_argument("--sft-lr", type=float, default=1.5e-4, help="stage 1's lr (sft_read.yaml: 5e-3, tiny)")
    p.add_argument("--sft-warmup", type=int, default=10, help="stage 1's warm-up steps")
    p.add_argument("--read-epochs", type=float, default=None, help="stage 1's epochs (sft_read.yaml's)")
    p.add_argument("--lr", type=float, default=3e-5, help="GRPO lr (grpo_turns.yaml: 1e-3, tiny)")
    p.add_argument("--kl", type=float, default=None, help="GRPO algorithm.kl_loss_coef (yaml's if unset)")
    p.add_argument(
        "--iterations", type=int, default=300, help="GRPO iterations at most (the budget stops it)"
    )
    p.add_argument("--val-every", type=int, default=10, help="GRPO held-out validation every K iterations")
    p.add_argument("--window", type=int, default=10, help="iterations per right-zoom window")
    p.add_argument(
        "--drop-weights",
        action="store_true",
        help="delete each GRPO run's weights once it is recorded (3B: ~14 GB each, fp32; a 64 GB disk holds "
        "the setup, stage 1 and two runs): on by itself at --shape 3b with --seeds 2 or more",
    )
    p.add_argument("--sft-set", nargs="*", default=[], help="key=value overrides of stage 1 only")
    p.add_argument("--grpo-set", nargs="*", default=[], help="key=value overrides of the GRPO runs only")
    p.add_argument("overrides", nargs="*", help="key=value overrides of every config (both stages)")
    a = p.parse_args(argv)
    a.device = a.device or ("cuda" if a.shape == "3b" else "cpu")
    a.drop_weights = a.drop_weights or (a.shape == "3b" and a.seeds > 1)
    a.arms = [arm.strip() for arm in a.arms.split(",") if arm.strip()]
    if not a.arms or set(a.arms) - {"zoom", "plain"}:
        p.error(f"--arms={','.join(a.arms)}: name zoom, plain or zoom,plain")
    return a


def common_overrides(a: argparse.Namespace) -> list[str]:
    """Both stages' device settings: bf16 on the GPU; gradient checkpointing (fp32 master weights, gradients
    and AdamW state of 3.4B parameters take ~55 GB, the engine's copy ~7 GB: a GRPO update's ~3k tokens of
    activations would not fit beside them); no optimizer state on disk (~27 GB a checkpoint); no
    torch.compile (a few thousand tokens a step: compiling each process's layers would cost more than it
    saves; `train.compile=auto` turns it back on)."""
    gpu = a.device.startswith("cuda")
    return [
        f"cluster.device={'cuda' if gpu else 'cpu'}",
        f"model.dtype={'bf16' if gpu else 'fp32'}",
        "model.gradient_checkpointing=true",
        "checkpoint.save_optimizer=false",
        "train.compile=off",
        "tracking.progress=false",
        *a.overrides,
    ]


def sft_command(a: argparse.Namespace, run: Path) -> list[str]:
    epochs = [f"epochs={a.read_epochs}"] if a.read_epochs else []
    return [
        "sft",
        str(HERE / "sft_read.yaml"),
        f"run_dir={run}",
        f"model.path={a.root / 'model'}",
        f"data.train_path={a.root / 'zoom' / 'read.jsonl'}",
        f"train.lr={a.sft_lr}",
        f"train.warmup_steps={a.sft_warmup}",
        *epochs,
        *common_overrides(a),
        *a.sft_set,
    ]


def grpo_command(a: argparse.Namespace, run: Path, start: Path, arm: str, seed: int) -> list[str]:
    """`run_comparison.grpo_turns`'s call at this run's settings: without the tool every turn takes the
    recipe's word grammar."""
    turns = yaml.safe_load((HERE / "grpo_turns.yaml").read_text())["rollout"]["grammar"]
    plain = (
        [] if arm == "zoom" else ["rollout.source.env=image_qa", f"rollout.grammar={json.dumps(turns[1:])}"]
    )
    kl = [f"algorithm.kl_loss_coef={a.kl}"] if a.kl is not None else []
    return [
        "train",
        str(HERE / "grpo_turns.yaml"),
        f"run_dir={run}",
        f"seed={seed}",
        f"model.path={start}",
        f"data.train_path={a.root / arm / 'rows.jsonl'}",
        f"data.val_path={a.root / arm / 'val.jsonl'}",
        f"iterations={a.iterations}",
        f"val_every={a.val_every}",
        f"train.lr={a.lr}",
        "rollout.engine=reference",  # the per-turn grammar needs it
        *plain,
        *kl,
        *common_overrides(a),
        *a.grpo_set,
    ]


def gpu_memory_mib() -> float | None:
    """Memory in use on GPU 0 (nvidia-smi), None where there is none."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return float(out.stdout.split()[0])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def metric_lines(path: Path, seen: int) -> tuple[list[dict[str, Any]], int]:
    """metrics.jsonl's complete lines after the first `seen`, and the new count."""
    if not path.exists():
        return [], seen
    lines = path.read_text().split("\n")[:-1]  # the last piece may be a line being written
    return [json.loads(line) for line in lines[seen:] if line.strip()], len(lines)


class Phase:
    """One command (a subprocess), watched: its metrics.jsonl printed as it grows, GPU memory polled, and a
    SIGTERM at its deadline (`stop_after_val`: at the first validation after which the next would not fit)."""

    def __init__(self, name: str, run_dir: Path | None, deadline: float, stop_after_val: bool = False):
        self.name, self.run_dir, self.deadline, self.stop_after_val = name, run_dir, deadline, stop_after_val
        self.peak_mib: float | None = None
        self.stopped = False  # by the budget
        self.vals: list[tuple[int, float, float]] = []  # (iteration, accuracy, time)
        self.losses: list[float] = []
        self.proc: subprocess.Popen | None = None
        self.termed_at: float | None = None  # when the budget's SIGTERM went

    def run(self, argv: list[str]) -> dict[str, Any]:
        print(f"\n[{self.name}] $ {shlex.join(argv)}", flush=True)
        t0 = time.time()
        env = os.environ | {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        }
        proc = self.proc = subprocess.Popen(argv, env=env)
        seen, last_poll = 0, 0.0
        while proc.poll() is None:
            time.sleep(0.5)
            if self.run_dir is not None:
                lines, seen = metric_lines(self.run_dir / "metrics.jsonl", seen)
                for m in lines:
                    self.on_metrics(m, t0)
            if time.time() - last_poll > 2.0:
                last_poll, mib = time.time(), gpu_memory_mib()
                if mib is not None:
                    self.peak_mib = max(self.peak_mib or 0.0, mib)
            self.police()
        if self.run_dir is not None:
            for m in metric_lines(self.run_dir / "metrics.jsonl", seen)[0]:
                self.on_metrics(m, t0)
        ok = proc.returncode == 0 or (self.stopped and proc.returncode == 128 + signal.SIGTERM)
        if not ok:
            sys.exit(f"[{self.name}] failed (exit {proc.returncode}): {shlex.join(argv)}")
        self.stopped = self.stopped and proc.returncode != 0  # a run that ended as the signal came finished
        return {"seconds": round(time.time() - t0, 1), "peak_gpu_mib": self.peak_mib, "stopped": self.stopped}

    def police(self) -> None:
        """SIGTERM once the deadline passes; a second SIGTERM (stop at once) EXIT_GRACE_S after the first."""
        now = time.time()
        if self.termed_at is None and now >= self.deadline:
            self.terminate("deadline reached")
        elif self.termed_at is not None and now - self.termed_at > EXIT_GRACE_S and self.proc is not None:
            print(
                f"[{self.name}] still running {EXIT_GRACE_S:.0f}s after SIGTERM: stopping at once", flush=True
            )
            self.proc.send_signal(signal.SIGTERM)
            self.termed_at = float("inf")  # once

    def terminate(self, why: str) -> None:
        print(f"[{self.name}] budget: {why}, SIGTERM (it checkpoints and stops)", flush=True)
        assert self.proc is not None
        self.stopped, self.termed_at = True, time.time()
        self.proc.send_signal(signal.SIGTERM)

    def on_metrics(self, m: dict[str, Any], t0: float) -> None:
        step = m.get("step")
        if "sft/nll" in m:
            self.losses.append(m["sft/nll"])
            more = f" lr {m.get('lr', 0.0):.2e} grad norm {m.get('grad_norm', float('nan')):.3f}"
            print(f"[{self.name}] step {step} nll {m['sft/nll']:.4f}{more}", flush=True)
        if "val/accuracy" in m:
            now = time.time()
            self.vals.append((int(step or 0), m["val/accuracy"], now - t0))
            print(f"[{self.name}] iteration {step}: held-out accuracy {m['val/accuracy']:.3f}", flush=True)
            if self.stop_after_val and len(self.vals) >= 2 and self.termed_at is None:
                chunk = self.vals[-1][2] - self.vals[-2][2]
                if now + chunk > self.deadline:
                    self.terminate("the next validation would not fit")
        elif "time/iteration" in m:
            reward, seconds = m.get("reward/mean", float("nan")), m["time/iteration"]
            print(f"[{self.name}] iteration {step}: reward {reward:.3f} ({seconds:.1f}s)", flush=True)


def right_zoom_windows(run_dir: Path, window: int) -> list[dict[str, Any]]:
    """Per `window` iterations of a run WITH the tool, from its experience store: the share of sampled
    episodes whose zoom call names the asked quarter's box (`right_zoom`), their mean reward, and the mean
    reward of the right-zoom ones (`reading`) (experience.db's prompt text holds the question, the response
    text the call)."""
    db = run_dir / "experience.db"
    if not db.exists():
        return []
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT iteration, prompt_text, response_text, reward FROM episodes").fetchall()
    finally:
        conn.close()
    buckets: dict[int, list[tuple[bool, float]]] = {}
    for it, prompt, response, reward in rows:
        asked = [q for q in BOXES if q in prompt]
        right = len(asked) == 1 and BOXES[asked[0]] in response
        buckets.setdefault((it - 1) // window, []).append((right, reward))
    out = []
    for b in sorted(buckets):
        eps = buckets[b]
        out.append(
            {
                "iterations": [b * window + 1, (b + 1) * window],
                "episodes": len(eps),
                "right_zoom": round(sum(r for r, _ in eps) / len(eps), 3),
                "reward": round(sum(x for _, x in eps) / len(eps), 3),
                "reading": round(sum(x for r, x in eps if r) / max(sum(r for r, _ in eps), 1), 3),
            }
        )
    return out


def newest_weights(run_dir: Path) -> Path:
    """A stage's finished weights: `final`, else (stopped by the budget) its newest checkpoint."""
    if (run_dir / "final" / "config.json").exists():
        return run_dir / "final"
    found = sorted((run_dir / "checkpoints").glob("iter_*"))
    if not found:
        sys.exit(f"{run_dir}: neither final/ nor a checkpoint: raise --budget-s or --sft-share")
    return found[-1]


def setup_and_sft(a: argparse.Namespace, t0: float, report: dict[str, Any]) -> Path:
    """make_setup.py at `--shape` (a subprocess: the parent never holds a CUDA context), then stage 1;
    returns stage 1's weights."""
    ascent = [sys.executable, "-m", "ascent"]
    setup = [sys.executable, str(HERE / "make_setup.py"), str(a.root), "--rows", str(a.rows)]
    setup += ["--shape", a.shape, "--device", a.device]
    report["phases"]["setup"] = Phase("setup", None, t0 + a.budget_s).run(setup)
    write(a, report)
    run = a.root / "sft_read"
    phase = Phase("sft", run, t0 + a.sft_share * a.budget_s)
    report["phases"]["sft"] = phase.run([*ascent, *sft_command(a, run)]) | {
        "nll": [round(x, 4) for x in phase.losses],
        "steps": len(phase.losses),
    }
    write(a, report)
    return newest_weights(run)


def grpo_runs(a: argparse.Namespace, t0: float, start: Path, report: dict[str, Any]) -> None:
    """Per seed, each arm's GRPO run from `start`, sharing what is left of the budget evenly."""
    runs = [(arm, seed) for seed in range(1, a.seeds + 1) for arm in a.arms]
    for i, (arm, seed) in enumerate(runs):
        left = t0 + a.budget_s - time.time()
        run = a.root / f"turns_{arm}_{seed}"
        deadline = time.time() + left / (len(runs) - i) - EXIT_RESERVE_S
        phase = Phase(f"grpo {arm} {seed}", run, deadline, stop_after_val=True)
        argv = [sys.executable, "-m", "ascent", *grpo_command(a, run, start, arm, seed)]
        timing = phase.run(argv)
        vals = [[it, acc] for it, acc, _ in phase.vals]
        done = metric_lines(run / "metrics.jsonl", 0)[0]
        report["phases"][f"grpo_{arm}_{seed}"] = timing
        report["runs"].append(
            {
                "arm": arm,
                "seed": seed,
                "iterations_done": max((m.get("step", 0) for m in done), default=0),
                "val": vals,
                "start": vals[0][1] if vals else None,
                "end": vals[-1][1] if vals else None,
                "windows": right_zoom_windows(run, a.window) if arm == "zoom" else [],
                **timing,
            }
        )
        write(a, report)
        if a.drop_weights:
            for weights in run.glob("**/*.safetensors"):
                weights.unlink()


def write(a: argparse.Namespace, report: dict[str, Any]) -> None:
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(report, indent=1))


def table(report: dict[str, Any]) -> str:
    lines = ["phase | seconds | peak GPU MiB | stopped by budget", "--- | --- | --- | ---"]
    for name, p in report["phases"].items():
        lines.append(f"{name} | {p['seconds']:.0f} | {p['peak_gpu_mib'] or '-'} | {p['stopped']}")
    sft = report["phases"].get("sft", {}).get("nll", [])
    if sft:
        tail = sft[-10:]
        lines.append(
            f"stage 1 nll: step 1 {sft[0]:.3f}, mean of the last {len(tail)} {sum(tail) / len(tail):.3f}"
        )
        lines.append(f"({len(sft)} steps; chance over the 4 pattern words is ln 4 = 1.386)")
    lines += ["", "run | iterations | held out (iteration: accuracy) | right zoom per window"]
    for r in report["runs"]:
        held = ", ".join(f"{it}: {acc:.3f}" for it, acc in r["val"])
        zooms = " / ".join(f"{w['right_zoom']:.2f}" for w in r["windows"]) or "-"
        lines.append(f"{r['arm']} seed {r['seed']} | {r['iterations_done']} | {held} | {zooms}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse(argv)
    t0 = time.time()
    a.root.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    args = {k: v if isinstance(v, int | float | list | type(None)) else str(v) for k, v in vars(a).items()}
    report: dict[str, Any] = {"args": args, "phases": {}, "runs": []}
    start = setup_and_sft(a, t0, report)
    grpo_runs(a, t0, start, report)
    report["total_seconds"] = round(time.time() - t0, 1)
    write(a, report)
    print("\n" + table(report) + f"\ntotal {report['total_seconds']:.0f}s", flush=True)
    return report


if __name__ == "__main__":
    main()
