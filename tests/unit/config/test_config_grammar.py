"""rollout.grammar: compiled at load (a grammar that does not compile is refused with llguidance's reason),
refused where nothing samples under it (the fast engine, an agent source), and carried to every request."""

from __future__ import annotations

import pytest

from ascent.config import ConfigError, load_config
from ascent.orchestrator.batch import sampling_params

AGENT = ["rollout.source={name: agent, agent: my_agent}"]
YES = """'start: "yes" | "no"'"""  # quoted: a command-line value is YAML


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rollout.grammar='start: foo'"], 'unknown name: "foo"'),
        (["rollout.grammar='start: (('"], "rollout.grammar"),
        (["rollout.grammar=start: foo"], "must be text"),  # unquoted on the command line: a YAML mapping
        (["rollout.engine=fast", f"rollout.grammar={YES}"], "rollout.grammar with rollout.engine=fast"),
        ([*AGENT, f"rollout.grammar={YES}"], "rollout.grammar with an agent source"),
    ],
)
def test_refused_grammars_name_the_field_and_the_reason(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert message in str(err.value)


def test_training_and_validation_requests_carry_the_compiled_grammar():
    cfg = load_config(None, [f"rollout.grammar={YES}"])
    train, val = sampling_params(cfg.rollout), sampling_params(cfg.rollout, validation=True)
    assert train.grammar is not None and train.grammar == val.grammar
    assert "yes" in train.grammar  # llguidance's JSON form of the Lark text
    assert sampling_params(load_config(None, []).rollout).grammar is None


def test_a_list_is_one_grammar_a_turn_and_each_must_compile():
    cfg = load_config(None, [f"rollout.grammar=[{YES}, 'start: \"ok\"']"])
    params = sampling_params(cfg.rollout)
    assert len(params.turn_grammars) == 2 and params.grammar == params.turn_grammars[0]
    assert "ok" in params.turn_grammars[1] and "ok" not in params.turn_grammars[0]
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"rollout.grammar=[{YES}, 'start: foo']"])
    assert "grammar 1 (turn 2) does not compile" in str(err.value)
    with pytest.raises(ConfigError):
        load_config(None, ["rollout.grammar=[]"])
