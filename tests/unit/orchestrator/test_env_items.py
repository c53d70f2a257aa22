"""Rendering the prompts of an environment source at start-up (`ascent.orchestrator.episodes.env_items`): one
reset per row in the environment processes, and a reset that fails stops the run at once."""

from __future__ import annotations

import time

import pytest

from ascent.config import load_config
from ascent.envs.runner import EnvResetError
from ascent.models import make_tiny_checkpoint
from ascent.models.loading import load_tokenizer
from ascent.orchestrator.episodes import env_items


@pytest.mark.timeout(120)
def test_a_reset_that_hangs_stops_the_run_after_a_few_rows_not_after_every_row(tmp_path) -> None:
    # 80 rows, 2 processes, 0.5 s each: waiting out every reset before the error took 20 s (with the
    # default 60 s timeout and 10,000 rows: three days); the first failed reset is enough to stop
    model = make_tiny_checkpoint(tmp_path / "model")
    env = "tests.unit.envs.hostile:HangsAtReset"
    cfg = load_config(
        None,
        [
            f"model.path={model}",
            f"rollout.source={{name: env, env: '{env}'}}",
            "rollout.env_timeout_s=0.5",
            "rollout.env_workers=2",
        ],
    )
    rows = [{"turns": 1} for _ in range(80)]
    t0 = time.monotonic()
    with pytest.raises(EnvResetError, match=r"^row 1: .*HangsAtReset.reset failed \(timed out after 0.5 s"):
        env_items(rows, load_tokenizer(model), env, cfg)
    assert time.monotonic() - t0 < 10
