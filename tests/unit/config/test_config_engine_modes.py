"""rollout.prefix_caching and rollout.batch_invariant: refused where they cannot hold, passed to the fast
engine's builder otherwise."""

from __future__ import annotations

import pytest

from ascent.config import ConfigError, load_config
from ascent.orchestrator.specs import engine_spec


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["rollout.engine=fast", "rollout.prefix_caching=true", "rollout.batch_invariant=true"],
            "rollout.prefix_caching=true with rollout.batch_invariant=true",
        ),
        (
            ["rollout.engine=fast", "rollout.batch_invariant=true", "rollout.tensor_parallel=2"],
            "rollout.batch_invariant=true with rollout.tensor_parallel=2",
        ),
        (["rollout.prefix_caching=true"], "rollout.prefix_caching=true with rollout.engine=reference"),
    ],
)
def test_refused_combinations_name_the_fields(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert message in str(err.value)


def test_the_fast_engine_gets_both_switches():
    cfg = load_config(None, ["rollout.engine=fast", "rollout.prefix_caching=true"])
    kw = engine_spec(cfg).builder_kwargs()
    assert kw["prefix_caching"] is True and kw["batch_invariant"] is False
    assert "prefix_caching" not in engine_spec(load_config(None, [])).builder_kwargs()  # reference engine
