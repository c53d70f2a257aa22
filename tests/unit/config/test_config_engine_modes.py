"""rollout.prefix_caching, rollout.batch_invariant and rollout.shared_prefix_attention: refused where they cannot hold, passed to the fast
engine's builder otherwise."""

from __future__ import annotations

import dataclasses

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
        (
            ["rollout.engine=fast", "rollout.shared_prefix_attention=true", "rollout.batch_invariant=true"],
            "rollout.shared_prefix_attention=true with rollout.batch_invariant=true",
        ),
        (
            ["rollout.shared_prefix_attention=true"],
            "rollout.shared_prefix_attention=true with rollout.engine=reference",
        ),
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


def test_shared_prefix_attention_reaches_the_builder_as_an_attention_option():
    cfg = load_config(None, ["rollout.engine=fast", "rollout.shared_prefix_attention=true"])
    spec = engine_spec(cfg)
    assert spec.builder_kwargs()["attn_options"] == {"shared_prefix": True}
    tuned = dataclasses.replace(spec, options={"attn_options": {"prefix_splits": 4}, "max_batch_size": 8})
    kw = tuned.builder_kwargs()  # a test's or benchmark's own attention options join it
    assert kw["attn_options"] == {"shared_prefix": True, "prefix_splits": 4} and kw["max_batch_size"] == 8
    unset = engine_spec(load_config(None, ["rollout.engine=fast"])).builder_kwargs()
    assert "attn_options" not in unset  # the engine's default (runner.SHARED_PREFIX)
    off = load_config(None, ["rollout.engine=fast", "rollout.shared_prefix_attention=false"])
    assert engine_spec(off).builder_kwargs()["attn_options"] == {"shared_prefix": False}
    off_ref = load_config(None, ["rollout.shared_prefix_attention=false"])  # nothing to refuse: it is off
    assert "attn_options" not in engine_spec(off_ref).builder_kwargs()
