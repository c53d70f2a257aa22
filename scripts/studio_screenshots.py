"""Screenshots of `ascent studio` for the README: trains three small runs on a tiny CPU model, serves them with
the studio, and saves PNGs of its pages into docs/studio/ with headless Chromium (Debian's `chromium`,
driven by Playwright; scripts/install_chromium.sh installs it).

    python scripts/studio_screenshots.py [--out docs/studio] [--work DIR]

Runs: two GRPO runs on one-digit addition that differ in learning rate (overlaid on the plots page, smoothed),
a multi-turn `guess_number` run (the episode browser shows its observations between model turns) and a short
`ascent sft` run (its own charts: NLL, learning rate, gradient norm, tokens/s). About a minute on two CPU cores.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MAX_BYTES = 300_000
VIEWPORT = {"width": 1280, "height": 800}


def train(config: dict, path: Path, command: str = "train") -> None:
    path.write_text(yaml.safe_dump(config))
    subprocess.run([sys.executable, "-m", "ascent", command, str(path)], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip


def base_config(run_dir: Path, model: Path, train_path: Path, val_path: Path, **extra: dict) -> dict:
    cfg: dict = {
        "run_dir": str(run_dir), "seed": 1, "iterations": 12, "val_every": 3,
        "model": {"path": str(model)},
        "data": {"train_path": str(train_path), "val_path": str(val_path), "max_prompt_tokens": 40},
        "rollout": {"prompts_per_step": 2, "samples_per_prompt": 4, "max_new_tokens": 4},
        "train": {"lr": 1e-3, "trajectories_per_update": 4, "max_tokens_per_micro_batch": 96},
        "tracking": {"progress": False},
    }  # fmt: skip
    for section, values in extra.items():
        cfg[section] = {**cfg.get(section, {}), **values} if isinstance(values, dict) else values
    return cfg


def build_runs(work: Path) -> Path:
    """Three finished runs under work/runs; returns that directory."""
    sys.path.insert(0, str(ROOT / "examples" / "arithmetic"))
    from make_data import make

    from ascent.models.tiny import make_tiny_checkpoint

    model = make_tiny_checkpoint(work / "tiny", hidden_size=32, num_layers=2, seed=0)
    data = make(work / "data", digits=1, sft=20, train=40, val=16, seed=0)
    runs = work / "runs"
    for seed, (name, lr) in enumerate((("addition/lr1e-3", 1e-3), ("addition/lr1e-2", 1e-2))):
        cfg = base_config(runs / name, model, data / "train.jsonl", data / "val.jsonl", train={"lr": lr})
        cfg["seed"] = seed
        train(cfg, work / f"{name.replace('/', '_')}.yaml")
    guess = work / "guess"
    guess.mkdir(exist_ok=True)
    for split, targets in (("train", [3, 7, 1, 9, 5, 0]), ("val", [4, 6])):
        (guess / f"{split}.jsonl").write_text("".join(json.dumps({"target": t}) + "\n" for t in targets))
    env = {
        "env": "guess_number",
        "max_turns": 3,
        "max_episode_tokens": 48,
        "stop_token_ids": list(range(4, 40)),
    }
    cfg = base_config(runs / "guess_number", model, guess / "train.jsonl", guess / "val.jsonl",
                      rollout=env, iterations=4, val_every=2)  # fmt: skip
    train(cfg, work / "guess.yaml")
    sft_rows = str(data / "sft.jsonl")
    sft = {
        "run_dir": str(runs / "sft"),
        "epochs": 8.0,
        "batch_size": 4,
        "val_every": 5,
        "model": {"path": str(model)},
        "data": {"train_path": sft_rows, "val_path": sft_rows, "max_prompt_tokens": 40},
        "train": {"lr": 3e-3, "warmup_steps": 5, "max_tokens_per_micro_batch": 256},
        "tracking": {"progress": False, "tensorboard": False},
    }
    train(sft, work / "sft.yaml", "sft")
    return runs


def multi_turn_episode(run_dir: Path) -> int:
    from ascent.tracking.experience_store import open_store

    with open_store(run_dir) as store:
        episodes = store.episodes()
    best = max(episodes, key=lambda r: (r.turns, r.status == "trained", -r.id))
    return best.id


def shoot(runs: Path, out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    from ascent.studio import StudioServer

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("error: no chromium; run scripts/install_chromium.sh (Debian's chromium package).")
    server = StudioServer(runs)
    url = server.start()
    out.mkdir(parents=True, exist_ok=True)
    episode = multi_turn_episode(runs / "guess_number")
    saved = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(60_000)

            def save(name: str) -> None:
                page.wait_for_timeout(600)  # let Plotly finish drawing
                path = out / f"{name}.png"
                page.screenshot(path=str(path))
                saved.append(path)

            page.goto(url)
            page.locator('tr[data-run="addition/lr1e-3"] input').check()
            page.locator('tr[data-run="addition/lr1e-2"] input').check()
            save("runs")
            page.locator("#compare").click()
            page.wait_for_function("() => document.querySelectorAll('.plot .main-svg').length >= 8")
            page.locator("#smoothing").evaluate(
                "el => { el.value = '0.6'; el.dispatchEvent(new Event('input')); }"
            )
            page.evaluate(
                "() => window.scrollTo(0, document.querySelector('details[data-group=train]').offsetTop - 60)"
            )
            save("plots")
            page.locator("#smoothing").evaluate(
                "el => { el.value = '0'; el.dispatchEvent(new Event('input')); }"
            )
            page.goto(f"{url}#/run/sft/plots")
            page.wait_for_function(
                "() => document.getElementById('plot:perf/tokens_per_s')?.data?.[0]?.x?.length > 1"
            )
            save("sft")
            page.goto(f"{url}#/run/addition%2Flr1e-3/timeline")
            page.locator("#gantt .main-svg").first.wait_for()
            save("timeline")
            page.goto(f"{url}#/run/guess_number/episode/{episode}")
            page.locator('#episode .segment[data-mask="1"]').nth(1).locator(".tok").first.hover()
            save("episode")
            page.goto(f"{url}#/run/guess_number/episodes")
            page.locator("#episodes tbody tr").first.wait_for()
            save("episodes")
            page.goto(f"{url}#/editor?run=addition%2Flr1e-3")
            page.locator("#verdict.ok").wait_for()
            text = page.locator("#yaml").input_value()
            text = text.replace("  lr: 0.001\n", "  lr: -1\n").replace(
                "  samples_per_prompt:", "  samples_per_promt:"
            )
            page.locator("#yaml").fill(text)
            page.locator("#problems li").first.wait_for()
            page.locator("#yaml").evaluate("el => { el.focus(); el.setSelectionRange(el.value.indexOf('lr: -1'), "
                                           "el.value.indexOf('lr: -1')); el.scrollTop = 0; }")  # fmt: skip
            page.keyboard.press("ArrowRight")
            save("editor")
            browser.close()
    finally:
        server.stop()
    return saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "studio")
    parser.add_argument("--work", type=Path, default=None, help="Where the runs go (default: a temp dir).")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="ascent-studio-shots-"))
    work.mkdir(parents=True, exist_ok=True)
    runs = work / "runs" if (work / "runs").is_dir() else build_runs(work)
    for path in shoot(runs, args.out):
        size = path.stat().st_size
        print(f"{path} ({size // 1000} KB)")
        if size > MAX_BYTES:
            print(f"warning: {path.name} is over {MAX_BYTES // 1000} KB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
