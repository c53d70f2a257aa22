"""`ascent studio` in a real browser: headless Chromium (Debian's `chromium` package, which scripts/test.sh
installs) driven by Playwright, against the real CLI in a subprocess while a real `ascent train` on the
tiny model writes the run it shows.

One training run serves the module: the runs page lists it as running, a metric chart gains points while
it trains (without the page or the chart being rebuilt), its charts have axis titles with units, the episode
list is newest first with a prompt column, a search that filters and pages, the episode browser opens one
of its episodes token by token, and the config editor refuses a bad value naming the field. A short `ascent
sft` run beside it (started with the RL run, so the two overlap) shows its own charts, none of PPO's, no
Episodes or Timeline tab, and the smoothing and log-scale controls redraw its charts. A studio bound to a
wider address refuses requests without its token.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_config, write_yaml

RUN_ID = "live/run"
SFT_ID = "sft"
CHROMIUM_NAMES = ("chromium", "chromium-browser")


def chromium_path() -> str:
    found = next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)
    if found is None:
        pytest.fail(
            "no Chromium: the studio's browser tests need Debian's `chromium` package; run "
            "scripts/test.sh (it installs it) or `apt-get install -y chromium`."
        )
    return found


def start_studio(root: Path, *args: str) -> tuple[subprocess.Popen, str]:
    """`ascent studio ROOT --port 0 ...` in a subprocess; returns it and the URL it printed."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ascent", "studio", str(root), "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    threading.Thread(
        target=lambda: [lines.put(line) for line in proc.stdout],  # type: ignore[union-attr]
        daemon=True,
    ).start()
    seen = []
    while True:
        try:
            line = lines.get(timeout=60)
        except queue.Empty:
            proc.kill()
            raise AssertionError(f"ascent studio printed no URL within 60 s: {seen}") from None
        seen.append(line)
        match = re.search(r" at (http://\S+)", line)
        if match:
            return proc, match.group(1)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def sft_config(root: Path, model: Path, data: Path) -> dict:
    """A 5-step `ascent sft` run (40 pairs, 8 per step) with a validation NLL every 2 steps."""
    sft_rows = str(data / "sft.jsonl")
    return {
        "run_dir": str(root / SFT_ID),
        "epochs": 1.0,
        "batch_size": 8,
        "val_every": 2,
        "model": {"path": str(model)},
        "data": {"train_path": sft_rows, "val_path": sft_rows, "max_prompt_tokens": 32},
        "train": {"lr": 3e-3, "max_tokens_per_micro_batch": 256},
        "tracking": {"progress": False, "tensorboard": False},
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model, arithmetic_data) -> Iterator[dict]:
    """RUNS_DIR with one RL run that trains (long enough to be watched) for the whole module, and a short SFT
    run started beside it: {"root": RUNS_DIR, "sft": its process}."""
    root = tmp_path_factory.mktemp("runs")
    cfg = run_config(root / "live", tiny_model, arithmetic_data, iterations=400, val_every=0)
    config = write_yaml(root.parent / "live.yaml", cfg)
    sft = write_yaml(root.parent / "sft.yaml", sft_config(root, tiny_model, arithmetic_data))
    log = (root.parent / "train.log").open("w")
    sft_log = (root.parent / "sft.log").open("w")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    train = subprocess.Popen(
        [sys.executable, "-m", "ascent", "train", str(config)], stdout=log, stderr=subprocess.STDOUT, env=env
    )
    sft_proc = subprocess.Popen(
        [sys.executable, "-m", "ascent", "sft", str(sft)], stdout=sft_log, stderr=subprocess.STDOUT, env=env
    )
    yield {"root": root, "sft": sft_proc}
    stop(train)
    stop(sft_proc)
    log.close()
    sft_log.close()


@pytest.fixture(scope="module")
def runs_root(runs: dict) -> Path:
    return runs["root"]


@pytest.fixture(scope="module")
def sft_run(runs: dict) -> Path:
    """The SFT run's directory, once `ascent sft` has finished."""
    code = runs["sft"].wait(300)
    log = (runs["root"].parent / "sft.log").read_text()
    assert code == 0, f"ascent sft exited {code}:\n{log}"
    return runs["root"] / SFT_ID


@pytest.fixture(scope="module")
def studio(runs_root: Path) -> Iterator[str]:
    proc, url = start_studio(runs_root)
    yield url
    stop(proc)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox", "--disable-gpu"])
        yield launched
        launched.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.set_default_timeout(60_000)
    yield page
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def plotted(page, metric: str) -> list[float]:
    """The x values Plotly holds for the chart of `metric` (the first trace: the only run)."""
    return page.evaluate("m => Array.from(document.getElementById('plot:' + m).data[0].x)", metric)


def axis_titles(page, metric: str) -> list[str]:
    """[x title, y title] of the chart of `metric`, as drawn (the SVG text, not only the layout asked for)."""
    return page.evaluate(
        "m => ['xtitle', 'ytitle'].map(c => document.getElementById('plot:' + m).querySelector('.' + "
        "c)?.textContent)",
        metric,
    )


def tick_labels(page, metric: str) -> list[str]:
    return page.evaluate(
        "m => Array.from(document.getElementById('plot:' + m).querySelectorAll('.ytick text'), t => "
        "t.textContent)",
        metric,
    )


def shown_ids(page) -> list[int]:
    """The episode ids the list shows, top to bottom."""
    return page.locator("#episodes tbody tr").evaluate_all("els => els.map(e => +e.dataset.episode)")


def logged_steps(runs_root: Path, metric: str) -> list[int]:
    lines = (runs_root / RUN_ID / "metrics.jsonl").read_text().splitlines()
    return [r["step"] for r in map(json.loads, lines) if r.get(metric) is not None]


def test_runs_page_lists_the_run_and_its_plot_grows_while_it_trains(
    page, studio: str, runs_root: Path
) -> None:
    page.goto(studio)
    row = page.locator(f'tr[data-run="{RUN_ID}"]')
    row.wait_for()  # the runs table refreshes every 5 s until the run has written its config
    assert row.locator(".badge").inner_text() == "running"
    row.get_by_role("link", name=RUN_ID).click()
    page.wait_for_function("() => document.getElementById('plot:reward/mean')?.data?.[0]?.x?.length >= 1")
    page.evaluate(
        "() => { window.__same_page = true; window.__chart = document.getElementById('plot:reward/mean'); }"
    )
    before = len(plotted(page, "reward/mean"))
    page.wait_for_function(
        "n => document.getElementById('plot:reward/mean').data[0].x.length >= n + 2",
        arg=before,
        timeout=90_000,
    )
    after = plotted(page, "reward/mean")
    assert len(after) >= before + 2
    assert after == logged_steps(runs_root, "reward/mean")[: len(after)]  # the run's own points, in order
    assert page.evaluate("() => window.__same_page === true")  # new points came without a page reload ...
    assert page.evaluate(
        "() => window.__chart === document.getElementById('plot:reward/mean')"
    )  # ... or a redraw
    groups = page.locator("details.group").evaluate_all("els => els.map(e => e.dataset.group)")
    assert groups[:3] == ["reward", "val", "rollout"] and "time" in groups
    assert axis_titles(page, "reward/mean") == ["iteration", "reward"]
    assert axis_titles(page, "time/update") == ["iteration", "s"]


def test_an_sft_run_shows_its_own_charts_and_the_controls_redraw_them(
    page, studio: str, sft_run: Path
) -> None:
    page.goto(f"{studio}#/run/{SFT_ID}/plots")
    page.wait_for_function("() => document.getElementById('plot:sft/nll')?.data?.[0]?.x?.length === 5")
    # derived from the record times: steps 2..5 (a step logged in the same millisecond as the last has none)
    page.wait_for_function(
        "() => document.getElementById('plot:perf/tokens_per_s')?.data?.[0]?.x?.length >= 1"
    )
    metrics = set(page.locator(".plot").evaluate_all("els => els.map(e => e.dataset.metric)"))
    assert {"sft/nll", "val/nll", "lr", "grad_norm", "perf/tokens_per_s", "time/step"} <= metrics
    assert not metrics & {"approx_kl", "clipfrac", "ratio"}
    assert not [m for m in metrics if m.startswith(("reward/", "rollout/"))]
    assert page.locator("#run-tabs a").all_inner_texts() == ["Plots", "Config"]  # no Timeline, no Episodes
    assert axis_titles(page, "sft/nll") == ["optimizer step", "nats/token"]
    assert axis_titles(page, "perf/tokens_per_s") == ["optimizer step", "tokens/s"]
    for metric in ("lr", "perf/tokens_per_s", "sft/nll"):  # fixed or exponential notation, no SI prefixes
        assert all(re.fullmatch(r"[−-]?[\d,.]+(e[+−-]?\d+)?", t) for t in tick_labels(page, metric)), metric

    nll = "document.getElementById('plot:sft/nll')"
    page.locator("#log-scale").check()
    page.wait_for_function(f"() => {nll}._fullLayout.yaxis.type === 'log'")
    page.locator("#smoothing").evaluate("el => { el.value = '0.9'; el.dispatchEvent(new Event('input')); }")
    page.wait_for_function(f"() => {nll}.data.length === 2")  # the raw points, faint, and the smoothed line
    raw, smooth = page.evaluate(f"() => [{nll}.data[0].y, {nll}.data[1].y]")
    assert smooth[0] == pytest.approx(raw[0]) and smooth[1:] != raw[1:]
    assert all(min(raw) - 1e-9 <= v <= max(raw) + 1e-9 for v in smooth)  # averages of the points so far
    page.select_option("#x-axis", "time")
    page.wait_for_function(f"() => {nll}.querySelector('.xtitle').textContent.startsWith('wall-clock time')")
    wall = page.evaluate(f"() => {nll}.data[0].x")
    assert wall[0] >= 0 and wall == sorted(wall)

    page.goto(f"{studio}#/run/{SFT_ID}/episodes")
    assert "SFT runs record no episodes" in page.locator("#no-episodes").inner_text()
    page.goto(f"{studio}#/run/{SFT_ID}/timeline")
    assert "only `ascent train` writes trace.json" in page.locator("#no-timeline").inner_text()
    assert page.locator(".error").count() == 0


def test_episode_list_is_newest_first_with_prompts_a_search_and_pages(
    page, studio: str, runs_root: Path
) -> None:
    from ascent.studio.episodes import prompt_preview
    from ascent.tracking.experience_store import open_store

    with open_store(runs_root / RUN_ID) as store:
        newest_before = max(r.id for r in store.episodes())
    page.goto(f"{studio}#/run/live%2Frun/episodes?limit=5")
    rows = page.locator("#episodes tbody tr")
    rows.first.wait_for()
    ids = shown_ids(page)
    assert len(ids) == 5 and ids == sorted(ids, reverse=True) and ids[0] >= newest_before
    assert page.locator("#episodes th[data-column=prompt]").count() == 1
    with open_store(runs_root / RUN_ID) as store:
        prompt = store.episode(ids[0]).prompt_text
    assert rows.first.locator("td.prompt").inner_text() == prompt_preview(prompt)

    # pages of a finished iteration: the live run keeps adding newer episodes, which would shift the offsets
    with open_store(runs_root / RUN_ID) as store:
        first_iteration = sorted((r.id for r in store.episodes(iteration=1)), reverse=True)
    page.goto(f"{studio}#/run/live%2Frun/episodes?iteration=1&limit=5")
    count = page.locator("#episode-count")
    count.filter(has_text=f"1–5 of {len(first_iteration)} matching").wait_for()
    assert shown_ids(page) == first_iteration[:5]
    page.locator("#older").click()
    count.filter(has_text=f"6–{min(10, len(first_iteration))} of").wait_for()
    assert shown_ids(page) == first_iteration[5:10]

    term = re.search(r"\d\+\d=", prompt).group(0)  # type: ignore[union-attr]
    page.goto(f"{studio}#/run/live%2Frun/episodes?limit=5")
    count.filter(has_text="episodes, newest first").wait_for()  # the unfiltered list is back
    page.locator("#episode-search").fill(term)
    page.locator("#episode-search").press("Enter")
    count.filter(has_text="matching").wait_for()
    found = re.match(r"1–\d+ of (\d+) matching \(of (\d+)\)", count.inner_text())
    assert found and int(found.group(1)) < int(found.group(2))
    shown = rows.evaluate_all(
        "els => els.map(e => e.querySelector('.prompt').textContent + "
        "e.querySelector('.response').textContent)"
    )
    assert shown and all(term in text for text in shown)


def test_episode_browser_opens_an_episode_token_by_token(page, studio: str, runs_root: Path) -> None:
    from ascent.tracking.experience_store import open_store

    page.goto(f"{studio}#/run/live%2Frun/episodes?status=trained")
    first = page.locator("#episodes tbody tr").first
    first.wait_for()
    episode_id = int(first.get_attribute("data-episode") or 0)
    first.click()
    page.locator("#episode .tok").first.wait_for()
    assert page.locator("h2").inner_text() == f"Episode {episode_id}"
    with open_store(runs_root / RUN_ID) as store:
        record = store.episode(episode_id)
    labels = page.locator(".segment .label").all_inner_texts()
    assert labels[0].startswith(f"prompt · {record.prompt_len} tokens · loss mask 0")
    assert page.locator("#episode .tok.m1").count() == sum(record.loss_mask)
    assert page.locator("#episode .tok.m0").count() == record.prompt_len + len(record.loss_mask) - sum(
        record.loss_mask
    )
    token = page.locator("#episode .tok.m1").first
    token.hover()
    tip = page.locator("#tip")
    assert tip.is_visible()
    assert f"logprob {record.sampler_logprobs[record.loss_mask.index(1)]:.4f}" in tip.inner_text()
    assert token.evaluate("el => getComputedStyle(el).backgroundColor") != "rgba(0, 0, 0, 0)"


def test_editor_refuses_a_bad_value_naming_the_field(page, studio: str) -> None:
    page.goto(f"{studio}#/editor?run=live%2Frun")
    verdict = page.locator("#verdict")
    verdict.filter(has_text="valid: ascent would accept").wait_for()
    text = page.locator("#yaml").input_value()
    assert re.search(r"(?m)^  lr: 0\.001$", text)
    page.locator("#yaml").fill(re.sub(r"(?m)^  lr: 0\.001$", "  lr: -1", text))
    problem = page.locator("#problems li").first
    problem.wait_for()
    assert problem.inner_text().startswith("train.lr=-1: must be > 0 (Peak learning rate of AdamW).")
    assert problem.get_attribute("data-field") == "train.lr"
    assert page.locator("#save").is_disabled()
    assert "1 problem" in verdict.inner_text()


def test_a_studio_bound_wide_refuses_requests_without_its_token(browser, runs_root: Path) -> None:
    proc, url = start_studio(runs_root, "--host", "0.0.0.0")
    try:
        token = re.search(r"\?token=(\S+)$", url)
        assert token, f"no token in the printed URL {url}"
        port = re.search(r":(\d+)/", url).group(1)  # type: ignore[union-attr]
        context = browser.new_context()
        page = context.new_page()
        refused = page.goto(f"http://127.0.0.1:{port}/")
        assert refused is not None and refused.status == 401
        assert "needs its token" in page.inner_text("body")
        assert page.goto(f"http://127.0.0.1:{port}/api/runs").status == 401  # type: ignore[union-attr]
        page.goto(f"http://127.0.0.1:{port}/?token={token.group(1)}")
        page.locator(f'tr[data-run="{RUN_ID}"]').wait_for(timeout=30_000)
        assert page.url == f"http://127.0.0.1:{port}/"  # the token left the address bar for a cookie
        context.close()
    finally:
        stop(proc)
