"""What `gpu_run.py` watches and records (issue #28): each phase's command as a subprocess on its own GPU
(its metrics.jsonl printed as it grows, its GPU's memory polled with nvidia-smi, a SIGTERM at its deadline),
several at once, and what a GRPO run's experience store says about it (where its episodes zoomed, how many
images a second it went through)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

from ascent.envs.tasks.zoom_task import QUARTERS

ROOT = Path(__file__).resolve().parents[2]  # the repository: its ascent for every subprocess
EXIT_GRACE_S = 90.0  # after SIGTERM: one iteration plus a 3B checkpoint (fp32 master weights, ~14 GB)
# the zoom call's box for each quarter (make_setup.py's calls and tokens), to score where an episode zoomed
BOXES = {q: f"{c / 2}, {r / 2}, {c / 2 + 0.5}, {r / 2 + 0.5}" for q, (c, r) in QUARTERS.items()}


def gpu_query(field: str, gpu: str | None) -> str | None:
    """nvidia-smi's `field` of GPU `gpu` (an index as CUDA_VISIBLE_DEVICES names it), None where none."""
    if gpu is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits", "-i", gpu],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def gpu_memory_mib(gpu: str | None) -> float | None:
    """Memory in use on GPU `gpu` (nvidia-smi), None where there is none."""
    try:
        return float((gpu_query("memory.used", gpu) or "").split()[0])
    except (ValueError, IndexError):
        return None


def metric_lines(path: Path, seen: int) -> tuple[list[dict[str, Any]], int]:
    """metrics.jsonl's complete lines after the first `seen`, and the new count."""
    if not path.exists():
        return [], seen
    lines = path.read_text().split("\n")[:-1]  # the last piece may be a line being written
    return [json.loads(line) for line in lines[seen:] if line.strip()], len(lines)


class Phase:
    """One command (a subprocess on `gpu`), watched by `poll`: its metrics.jsonl printed as it grows, its GPU's
    memory polled, and a SIGTERM at its deadline (`stop_after_val`: at the first validation after which the
    next would not fit)."""

    def __init__(self, name: str, run_dir: Path | None, deadline: float, stop_after_val: bool = False):
        self.name, self.run_dir, self.deadline, self.stop_after_val = name, run_dir, deadline, stop_after_val
        self.gpu: str | None = None
        self.peak_mib: float | None = None
        self.stopped = False  # by the budget
        self.vals: list[tuple[int, float, float]] = []  # (iteration, accuracy, time)
        self.losses: list[float] = []
        self.proc: subprocess.Popen | None = None
        self.termed_at: float | None = None  # when the budget's SIGTERM went
        self.t0 = self.last_poll = 0.0
        self.ended: float | None = None
        self.seen = 0

    def start(self, argv: list[str], gpu: str | None) -> None:
        print(f"\n[{self.name}] {'' if gpu is None else f'GPU {gpu} '}$ {shlex.join(argv)}", flush=True)
        self.gpu, self.t0 = gpu, time.time()
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        env = os.environ | {"PYTHONPATH": path} | ({} if gpu is None else {"CUDA_VISIBLE_DEVICES": gpu})
        self.proc = subprocess.Popen(argv, env=env)

    def poll(self) -> bool:
        """Watch once; True while the command runs."""
        assert self.proc is not None
        running = self.proc.poll() is None
        if self.run_dir is not None:
            lines, self.seen = metric_lines(self.run_dir / "metrics.jsonl", self.seen)
            for m in lines:
                self.on_metrics(m)
        if time.time() - self.last_poll > 2.0:
            self.last_poll, mib = time.time(), gpu_memory_mib(self.gpu)
            if mib is not None:
                self.peak_mib = max(self.peak_mib or 0.0, mib)
        if running:
            self.police()
        elif self.ended is None:
            self.ended = time.time()
        return running

    def result(self) -> dict[str, Any]:
        """Once `poll` says done: its timing, peak memory, whether the budget stopped it and `ok`."""
        assert self.proc is not None
        code = self.proc.returncode
        ok = code == 0 or (self.stopped and code == 128 + signal.SIGTERM)
        self.stopped = self.stopped and code != 0  # a run that ended as the signal came finished
        timing = {"seconds": round((self.ended or time.time()) - self.t0, 1), "peak_gpu_mib": self.peak_mib}
        return timing | {"gpu": self.gpu, "stopped": self.stopped, "ok": ok, "exit": code}

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

    def on_metrics(self, m: dict[str, Any]) -> None:
        step = m.get("step")
        if "sft/nll" in m:
            self.losses.append(m["sft/nll"])
            more = f" lr {m.get('lr', 0.0):.2e} grad norm {m.get('grad_norm', float('nan')):.3f}"
            print(f"[{self.name}] step {step} nll {m['sft/nll']:.4f}{more}", flush=True)
        if "val/accuracy" in m:
            now = time.time()
            self.vals.append((int(step or 0), m["val/accuracy"], now - self.t0))
            print(f"[{self.name}] iteration {step}: held-out accuracy {m['val/accuracy']:.3f}", flush=True)
            if self.stop_after_val and len(self.vals) >= 2 and self.termed_at is None:
                chunk = self.vals[-1][2] - self.vals[-2][2]
                if now + chunk > self.deadline:
                    self.terminate("the next validation would not fit")
        elif "time/iteration" in m:
            reward, seconds = m.get("reward/mean", float("nan")), m["time/iteration"]
            print(f"[{self.name}] iteration {step}: reward {reward:.3f} ({seconds:.1f}s)", flush=True)


def run_phases(jobs: list[tuple[Phase, list[str], str | None]]) -> list[dict[str, Any]]:
    """Start every (phase, argv, gpu) at once, watch them until all have ended; their `result`s."""
    for phase, argv, gpu in jobs:
        phase.start(argv, gpu)
    running = [phase for phase, _, _ in jobs]
    while running:
        time.sleep(0.5)
        running = [phase for phase in running if phase.poll()]
    return [phase.result() for phase, _, _ in jobs]


def episodes(run_dir: Path) -> list[tuple[int, str, str, float, int]]:
    """(iteration, prompt text, response text, reward, model turns) of every episode in the run's experience
    store (experience.db), [] without one."""
    db = run_dir / "experience.db"
    if not db.exists():
        return []
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    try:
        query = "SELECT iteration, prompt_text, response_text, reward, turns FROM episodes"
        return conn.execute(query).fetchall()
    finally:
        conn.close()


def right_zoom_windows(run_dir: Path, window: int) -> list[dict[str, Any]]:
    """Per `window` iterations of a run WITH the tool, from its experience store: the share of sampled
    episodes whose zoom call names the asked quarter's box (`right_zoom`), their mean reward, and the mean
    reward of the right-zoom ones (`reading`) (the prompt text holds the question, the response the call)."""
    buckets: dict[int, list[tuple[bool, float]]] = {}
    for it, prompt, response, reward, _ in episodes(run_dir):
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


def throughput(run_dir: Path, done: list[dict[str, Any]]) -> dict[str, float | None]:
    """Mean seconds an iteration, and episodes and images a second over the iterations' time (an episode
    shows one image a model turn: the question's, then each zoom's)."""
    seconds = sum(m["time/iteration"] for m in done if "time/iteration" in m)
    eps = episodes(run_dir)
    iterations = sum(1 for m in done if "time/iteration" in m)
    if not seconds or not eps:
        return {"seconds_per_iteration": None, "episodes_per_s": None, "images_per_s": None}
    return {
        "seconds_per_iteration": round(seconds / iterations, 2),
        "episodes_per_s": round(len(eps) / seconds, 2),
        "images_per_s": round(sum(e[4] for e in eps) / seconds, 2),
    }
