"""`rollout.source` as a union switched on its name (prompt, env, agent), each member with only its own
fields; the older flat fields (`rollout.env`, `rollout.agent`, `rollout.max_turns`, ...) refused with the new
spelling, and translated silently where an older checkpoint's saved config is compared (`nest_legacy`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ascent.cli import app
from ascent.config import ConfigError, RunConfig, dump_config, load_config
from ascent.config.explain import explain_rows, matching_rows
from ascent.config.sources import AgentSourceConfig, EnvSourceConfig, PromptSourceConfig


def refused(overrides: list[str], path: Path | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return info.value.problems


def test_the_default_is_prompts_and_each_source_holds_its_own_fields(tmp_path: Path) -> None:
    assert RunConfig().rollout.source == PromptSourceConfig()
    assert not RunConfig().rollout.multi_turn and RunConfig().rollout.response_budget == 256
    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump({"rollout": {"source": {"name": "env", "env": "guess_number", "max_turns": 3}}})
    )
    r = load_config(path).rollout
    assert r.source == EnvSourceConfig(env="guess_number", max_turns=3, max_episode_tokens=512)
    assert r.multi_turn and r.response_budget == 512
    agent = load_config(None, ["rollout.source=agent", "rollout.source.agent=pkg.mod:run"]).rollout.source
    assert agent == AgentSourceConfig(agent="pkg.mod:run", timeout_s=300.0, concurrency=32)
    assert load_config(None, ["rollout.source=prompt"]).rollout.source == PromptSourceConfig()
    # the resolved config reads back
    cfg = load_config(path)
    assert load_config(_written(tmp_path, dump_config(cfg))) == cfg


def _written(tmp_path: Path, text: str) -> Path:
    out = tmp_path / "resolved.yaml"
    out.write_text(text)
    return out


def test_the_older_flat_fields_are_refused_with_the_new_spelling(tmp_path: Path) -> None:
    (env,) = refused(["rollout.env=guess_number", "rollout.max_turns=3"])
    assert env.startswith(
        "rollout.env='guess_number', rollout.max_turns=3: the episode source is one setting"
    )
    assert "rollout.source='{name: env, env: guess_number, max_turns: 3}'" in env
    path = tmp_path / "old.yaml"
    path.write_text(
        yaml.safe_dump({"rollout": {"agent": "pkg.mod:run", "agent_timeout_s": 10, "agent_concurrency": 4}})
    )
    (agent,) = refused([], path)
    assert agent.startswith(
        "rollout.agent='pkg.mod:run', rollout.agent_timeout_s=10, rollout.agent_concurrency=4:"
    )
    assert (
        "`source: {name: agent, agent: pkg.mod:run, timeout_s: 10, concurrency: 4}` under `rollout:`" in agent
    )
    # the spelling it offers loads
    assert load_config(
        None, ["rollout.source={name: agent, agent: pkg.mod:run, timeout_s: 10, concurrency: 4}"]
    )
    (off,) = refused(["rollout.env=null"])
    assert "rollout.source='{name: prompt}'" in off


def test_the_cli_refuses_an_old_spelling_with_exit_status_2() -> None:
    result = CliRunner().invoke(app, ["config", "show", "rollout.env=guess_number"])
    assert result.exit_code == 2 and "rollout.source='{name: env, env: guess_number}'" in result.output


def test_a_setting_of_another_source_names_the_source_that_reads_it() -> None:
    (turns,) = refused(["rollout.source.max_turns=3"])
    assert turns == (
        "rollout.source.max_turns=3: only source=env or agent reads it, and this run's source is prompt; "
        "remove it or set rollout.source: {name: env, env: ..., max_turns: 3}."
    )
    (env,) = refused(["rollout.source={name: agent, agent: m:run, env: x}"])
    assert env.startswith("rollout.source.env='x': only source=env reads it, and this run's source is agent")
    (missing,) = refused(["rollout.source=env"])
    assert missing.startswith("rollout.source.env is required")
    (unknown,) = refused(["rollout.source=envs"])
    assert unknown.startswith("rollout.source='envs': must be one of prompt, env, agent")
    (typo,) = refused(["rollout.source=agent", "rollout.source.agent=m:run", "rollout.source.timout_s=3"])
    assert typo == "unknown key 'rollout.source.timout_s'; did you mean 'rollout.source.timeout_s'?"


def test_explain_shows_the_chosen_source_and_its_fields() -> None:
    cfg = load_config(None, ["rollout.source={name: env, env: guess_number}"])
    rows = {r.path: r for r in matching_rows(explain_rows(cfg), ["rollout.source"])}
    assert set(rows) == {
        "rollout.source.name",
        "rollout.source.env",
        "rollout.source.max_turns",
        "rollout.source.max_episode_tokens",
        "rollout.source.sims_per_worker",
    }
    assert (
        rows["rollout.source.env"].value == "guess_number" and rows["rollout.source.max_turns"].default == 4
    )
    assert rows["rollout.source.name"].changed and "environment" in rows["rollout.source.env"].description
