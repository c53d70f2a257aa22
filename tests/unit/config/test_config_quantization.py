"""rollout.quantization: refused where it cannot run (the reference engine, adapter-only publication), passed
to the fast engine's builder otherwise."""

from __future__ import annotations

import pytest

from ascent.config import ConfigError, load_config
from ascent.orchestrator.specs import engine_spec


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rollout.quantization=fp8"], "rollout.quantization=fp8 with rollout.engine=reference"),
        (
            [
                "rollout.engine=fast",
                "rollout.quantization=fp8",
                "model.lora.rank=4",
                "model.lora.publish=adapter",
                "cluster.engine_sleeps=false",
            ],
            "model.lora.publish=adapter: an FP8 engine (rollout.quantization=fp8)",
        ),
        (["rollout.engine=fast", "rollout.quantization=int8"], "rollout.quantization"),
    ],
)
def test_refused_combinations_name_the_fields(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert message in str(err.value)


def test_the_fast_engine_gets_the_quantization():
    kw = engine_spec(load_config(None, ["rollout.engine=fast", "rollout.quantization=fp8"])).builder_kwargs()
    assert kw["quantization"] == "fp8"
    assert engine_spec(load_config(None, ["rollout.engine=fast"])).builder_kwargs()["quantization"] == "none"
    assert "quantization" not in engine_spec(load_config(None, [])).builder_kwargs()  # reference engine
