"""resolve_reward_fn: built-in names, import paths from a module written to tmp_path, and clear errors."""

from __future__ import annotations

import pytest

from ascent.rewards import REWARD_FUNCTIONS, check_reward_signature, resolve_reward_fn

MODULE = """
LIMIT = 3

def length_reward(prompt, response, response_ids, metadata, **kwargs):
    return min(len(response_ids), LIMIT) / LIMIT

class Scorers:
    @staticmethod
    def constant(prompt, response, response_ids, metadata):
        return 1.0
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards_for_test.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "my_rewards_for_test", raising=False)
    return "my_rewards_for_test"


def test_builtin_names():
    for name, fn in REWARD_FUNCTIONS.items():
        assert resolve_reward_fn(name) is fn
    assert resolve_reward_fn("  gsm8k ") is REWARD_FUNCTIONS["gsm8k"]


def test_import_path(user_module):
    fn = resolve_reward_fn(f"{user_module}:length_reward")
    assert fn("p", "abc", [1, 2], {}) == pytest.approx(2 / 3)
    nested = resolve_reward_fn(f"{user_module}:Scorers.constant")
    assert nested("p", "r", [], {}) == 1.0


def test_missing_module():
    with pytest.raises(
        ValueError, match="reward.fn='no_such_pkg.rewards:f': no module 'no_such_pkg' .* check the spelling"
    ):
        resolve_reward_fn("no_such_pkg.rewards:f")


def test_missing_attribute_and_not_callable(user_module):
    with pytest.raises(ValueError, match=f"module '{user_module}' has no attribute 'nope'"):
        resolve_reward_fn(f"{user_module}:nope")
    with pytest.raises(ValueError, match="LIMIT in .* is a int, not callable"):
        resolve_reward_fn(f"{user_module}:LIMIT")


def test_unknown_builtin_name():
    with pytest.raises(ValueError, match="reward.fn=exact: not a built-in reward .*pkg.module:function"):
        resolve_reward_fn("exact")
    with pytest.raises(ValueError, match="row 3 reward_fn=''"):
        resolve_reward_fn("", field="row 3 reward_fn")


def test_signature_check(user_module):
    constant = resolve_reward_fn(f"{user_module}:Scorers.constant")
    check_reward_signature(constant, {}, "reward.fn")
    with pytest.raises(
        ValueError, match=r"reward.fn=x: cannot be called as fn\(prompt, response, response_ids, metadata"
    ):
        check_reward_signature(constant, {"scale": 2}, "reward.fn=x")
    check_reward_signature(resolve_reward_fn(f"{user_module}:length_reward"), {"scale": 2}, "reward.fn")


def test_errors_are_user_facing():
    from ascent.errors import AscentError

    with pytest.raises(AscentError):
        resolve_reward_fn("nope")
