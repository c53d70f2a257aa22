"""What bench/two_gpus.py measures around a run and prints: GPU memory and utilisation sampled with
nvidia-smi, the run's metrics.jsonl summarised over the iterations after warm-up, and the tables.

Kept apart from two_gpus.py (which builds and runs the modes) for size. Nothing here imports torch or ascent's
workers: the parent process of the benchmark, which holds no CUDA context, uses it.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time
from typing import Any

# metrics.jsonl keys summarised per mode (ascent/orchestrator/loop.py, shaping.py, collector.py)
PHASES = (
    "iteration",
    "rollout",
    "generate",
    "reward",
    "logprobs",
    "advantages",
    "update",
    "publish",
    "weight_transfer",
    "trainer_idle",
    "engine_idle",
)
OTHER_KEYS = (
    "rollout/response_len_mean",
    "rollout/staleness_max",
    "rollout/logprob_diff_max",
    "memory/trainer_released_gib",
    "perf/tokens_per_s",
    "rollout/swapped_sequences",
    "train/optimizer_steps",
)
GIB_PER_MIB = 1 / 1024


class GpuSampler:
    """Polls `nvidia-smi` every `interval_s` on a thread: per GPU, (unix time, MiB used, % utilisation). A
    no-op without nvidia-smi. One query per poll (not its loop mode, whose piped output may be buffered)."""

    QUERY = "--query-gpu=index,memory.used,memory.total,utilization.gpu"

    def __init__(self, interval_s: float = 0.5) -> None:
        self.samples: dict[int, list[tuple[float, float, float | None]]] = {}
        self.total_mib: dict[int, float] = {}
        self.exe, self.interval_s = shutil.which("nvidia-smi"), interval_s
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        if self.exe is not None:
            self.thread.start()

    def _poll(self) -> None:
        assert self.exe is not None
        cmd = [self.exe, self.QUERY, "--format=csv,noheader,nounits"]
        while not self.done.is_set():
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
            except subprocess.TimeoutExpired:
                continue
            now = time.time()
            for line in out.splitlines():
                parts = [p.strip() for p in line.split(",")] + [""] * 4
                try:
                    idx, used, total = int(parts[0]), float(parts[1]), float(parts[2])
                except ValueError:
                    continue  # a partial line, or "[N/A]" memory
                self.total_mib[idx] = total
                self.samples.setdefault(idx, []).append((now, used, _number(parts[3])))
            self.done.wait(self.interval_s)

    def stop(self) -> None:
        self.done.set()
        if self.thread.is_alive():
            self.thread.join(timeout=15)

    def window(self, t0: float | None = None, t1: float | None = None) -> dict[str, Any]:
        """Per GPU: peak GiB used and mean utilisation over [t0, t1] (unix seconds; None: unbounded)."""
        out: dict[str, Any] = {}
        for idx, rows in sorted(self.samples.items()):
            kept = [r for r in rows if (t0 is None or r[0] >= t0) and (t1 is None or r[0] <= t1)]
            util = [r[2] for r in kept if r[2] is not None]
            if kept:
                out[str(idx)] = {
                    "peak_gib": max(r[1] for r in kept) * GIB_PER_MIB,
                    "util_mean": statistics.fmean(util) if util else None,
                    "total_gib": self.total_mib[idx] * GIB_PER_MIB,
                    "samples": len(kept),
                }
        return out


def _number(text: str) -> float | None:
    """nvidia-smi's figure, or None for "[N/A]" (utilisation under MIG, for one)."""
    try:
        return float(text)
    except ValueError:
        return None


def facts(args: Any) -> dict[str, Any]:
    """The command line, the date, the GPUs and how they are linked (NVLink or PCIe: broadcast speed)."""
    out: dict[str, Any] = {
        "args": {k: v for k, v in vars(args).items() if k != "argv"},
        "date": time.strftime("%F %T"),
    }
    exe = shutil.which("nvidia-smi")
    if exe:
        q = subprocess.run(
            [exe, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        )
        out["gpus"] = q.stdout.strip().splitlines()
        topo = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True)
        out["topology"] = topo.stdout
    return out


def stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(records: list[dict[str, Any]], warmup: int, trajectories: int) -> dict[str, Any]:
    """Iterations after the first `warmup` of a run's metrics.jsonl: median/min/max of each phase and key,
    completions/s from the median iteration and from the wall clock between the records' timestamps (which
    counts what happens between iterations too: metrics, logging, the experience store)."""
    rows = sorted(
        (r for r in records if r.get("step", 0) >= 1 and "time/iteration" in r), key=lambda r: r["step"]
    )
    timed = rows[warmup:]
    out: dict[str, Any] = {"iterations_logged": len(rows), "iterations_timed": len(timed)}
    if not timed:
        return out
    keys = [f"time/{p}" for p in PHASES] + list(OTHER_KEYS)
    out["keys"] = {
        k: stats([r[k] for r in timed if r.get(k) is not None])
        for k in keys
        if any(r.get(k) is not None for r in timed)
    }
    its = [r["time/iteration"] for r in timed]
    out["completions_per_s_median_iteration"] = trajectories / statistics.median(its)
    if warmup >= 1:  # record to record: the iteration plus whatever runs between two iterations
        periods = [b["time"] - a["time"] for a, b in zip(rows[warmup - 1 :], timed, strict=False)]
        out["keys"]["time/period"] = stats(periods)
        out["completions_per_s_median_period"] = trajectories / statistics.median(periods)
    start = rows[warmup - 1]["time"] if warmup >= 1 else timed[0]["time"] - timed[0]["time/iteration"]
    wall = timed[-1]["time"] - start
    out["timed_window"] = (start, timed[-1]["time"])
    out["wall_s"] = wall
    out["completions_per_s_wall"] = trajectories * len(timed) / wall if wall > 0 else None
    out["steps_timed"] = [r["step"] for r in timed]
    return out


def _fmt(v: Any, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def mode_table(res: dict[str, Any]) -> str:
    """One mode's table: its setup line, then median [min-max] of each phase after warm-up, throughput,
    memory."""
    s, w = res.get("summary", {}), res["workload"]
    lines = [
        f"== {res['mode']}: {res['layout']} | shape {res['shape']} | {w['prompts']}x{w['samples']} prompt "
        f"{w['prompt_len']} new {w['new_tokens']} | transport {res['transport']} | rc {res.get('rc')} "
        f"| wall {res.get('child_wall_s', 0):.0f} s",
    ]
    if not s.get("iterations_timed"):
        lines.append(f"no timed iteration ({s.get('iterations_logged', 0)} logged, warm-up {w['warmup']})")
        return "\n".join(lines)
    lines.append(
        f"iterations {s['steps_timed'][0]}-{s['steps_timed'][-1]} ({s['iterations_timed']} after "
        f"{w['warmup']} warm-up): completions/s {s['completions_per_s_wall']:.2f} (wall), "
        f"{s['completions_per_s_median_iteration']:.2f} (median iteration)"
        + (
            f", {s['completions_per_s_median_period']:.2f} (median period)"
            if "time/period" in s["keys"]
            else ""
        )
    )
    period, iteration = s["keys"].get("time/period"), s["keys"].get("time/iteration")
    if period and iteration and period["median"] > 1.05 * iteration["median"]:
        lines.append(
            f"WARNING: the median period between iterations ({period['median']:.2f} s) exceeds the median "
            f"iteration ({iteration['median']:.2f} s): work outside time/iteration; read the period"
        )
    lines.append(f"{'metric':<28}{'median':>10}{'min':>10}{'max':>10}")
    for key, v in s["keys"].items():
        lines.append(f"{key:<28}{_fmt(v['median']):>10}{_fmt(v['min']):>10}{_fmt(v['max']):>10}")
    lines.extend(memory_lines(res))
    return "\n".join(lines)


def memory_lines(res: dict[str, Any]) -> list[str]:
    gpus, whole = res.get("gpus_timed", {}), res.get("gpus_run", {})
    if not whole:
        return ["peak GPU memory: n/a (no nvidia-smi: CPU run)"]
    per = [
        f"GPU{i} {g['peak_gib']:.1f} GiB of {g['total_gib']:.0f} (timed iterations: "
        f"{_fmt(gpus.get(i, {}).get('peak_gib'), 1)} GiB, util {_fmt(gpus.get(i, {}).get('util_mean'), 0)}%)"
        for i, g in whole.items()
    ]
    lines = [f"peak GPU memory used (nvidia-smi, whole run): {'; '.join(per)}"]
    est = res.get("doctor_estimate", {})
    if est:
        lines.append(
            f"ascent doctor's estimate per GPU: {est['peak_gib']:.1f} GiB allocated at peak "
            f"({est['peak_phase']}), needs {est['needed_gib']:.1f} GiB"
            + (
                f"; trainer's update peak + engine as two processes (Ray colocated): "
                f"{est['two_process_gib']:.1f} GiB"
                if "two_process_gib" in est
                else ""
            )
        )
    return lines


def compare_table(results: list[dict[str, Any]]) -> str:
    """The modes side by side; the ratio is completions/s (wall) over one_gpu's (same shape only)."""
    base = next((r for r in results if r["mode"] == "one_gpu"), {})
    base_cps = base.get("summary", {}).get("completions_per_s_wall")
    head = (
        f"{'mode':<14}{'shape':>6}{'GPUs':>5}{'compl/s':>9}{'x1 GPU':>8}{'iter s':>8}{'gen s':>7}{'upd s':>7}"
        f"{'pub s':>7}{'tr.idle':>8}{'en.idle':>8}{'stale':>6}{'peak GiB/GPU':>16}"
    )
    lines = [head]
    for r in results:
        s = r.get("summary", {})
        k = s.get("keys", {})
        cps = s.get("completions_per_s_wall")
        med = {p: k.get(f"time/{p}", {}).get("median") for p in PHASES}
        peaks = "/".join(f"{g['peak_gib']:.1f}" for g in r.get("gpus_run", {}).values()) or "-"
        ratio = cps / base_cps if cps and base_cps and r["shape"] == base["shape"] else None
        lines.append(
            f"{r['mode']:<14}{r['shape']:>6}{r['gpus']:>5}{_fmt(cps, 2):>9}{_fmt(ratio, 2):>8}"
            f"{_fmt(med['iteration'], 2):>8}"
            f"{_fmt(med['generate'], 2):>7}{_fmt(med['update'], 2):>7}{_fmt(med['publish'], 3):>7}"
            f"{_fmt(med['trainer_idle'], 2):>8}{_fmt(med['engine_idle'], 2):>8}"
            f"{_fmt(k.get('rollout/staleness_max', {}).get('max'), 0):>6}{peaks:>16}"
        )
    return "\n".join(lines)


def publish_table(rows: list[dict[str, Any]]) -> str:
    """bench/publish.py's rows: seconds per publication (median [min-max] after the first), bytes,
    start-up."""
    lines = [
        f"{'shape':<7}{'params':>8}{'transport':>11}{'median s':>10}{'min':>8}{'max':>8}{'first s':>9}"
        f"{'GB/s':>7}{'start s':>9}"
    ]
    for r in rows:
        gbps = r.get("bytes_sent", 0) / r["publish_s_median"] / 1e9 if r.get("bytes_sent") else None
        lines.append(
            f"{r['shape']:<7}{r['params'] / 1e9:>7.2f}B{r['transport']:>11}{r['publish_s_median']:>10.3f}"
            f"{r['publish_s_min']:>8.3f}{r['publish_s_max']:>8.3f}{r['first_s']:>9.3f}"
            f"{_fmt(gbps, 1):>7}{r['group_start_s']:>9.1f}"
        )
    return "\n".join(lines)
