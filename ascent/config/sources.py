"""Where a run's episodes come from, `rollout.source`: a config union switched on its name, each member holding
only its own fields (design: "Every source is an environment"; the same pattern as `choices.py`).

    rollout:
      source: prompt                                   # one response per prompt, scored by reward.fn
      source: {name: env, env: guess_number, max_turns: 3, max_episode_tokens: 128}
      source: {name: agent, agent: mypkg.agent:run, timeout_s: 120, concurrency: 8}

Before the union these were flat `rollout` fields (`rollout.env`, `rollout.agent`, `rollout.agent_timeout_s`,
`rollout.agent_concurrency`, `rollout.max_turns`, `rollout.max_episode_tokens`). `legacy_problem` refuses them
with the new spelling; `nest_legacy` translates them silently (the config saved in older checkpoints, which
`--resume` compares with). `source_problems` names a setting the chosen source does not read. Imports
without torch.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import yaml
from pydantic import Discriminator, Field, Tag, model_validator

from ascent.config.errors import show_value
from ascent.config.section import Section

NAME = (
    "Which source: `prompt` (one response per prompt, scored by reward.fn), `env` (an environment's "
    "multi-turn episodes: {name: env, env: NAME, max_turns, max_episode_tokens}) or `agent` (an agent written "
    "against the OpenAI API: {name: agent, agent: pkg.module:run, timeout_s, concurrency, max_turns, "
    "max_episode_tokens})."
)
MAX_TURNS = "Most model turns (the environment's steps, the agent's calls) per episode."
MAX_EPISODE_TOKENS = (
    "Most response tokens per episode (model turns and observations); each turn samples at most "
    "rollout.max_new_tokens of them. The Dr. GRPO divisor and the micro-batch check use it."
)


class SourceChoice(Section):
    """A member of the source union. A bare name (`"prompt"`) validates as that member with its defaults."""

    name: str = Field(description=NAME)

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data


class PromptSourceConfig(SourceChoice):
    """One response per prompt, scored by reward.fn."""

    name: Literal["prompt"] = Field("prompt", description=NAME)

    @property
    def label(self) -> str:
        """How messages name this source."""
        return "rollout.source=prompt"


class EnvSourceConfig(SourceChoice):
    """Multi-turn episodes through an environment, which gives the prompt and the rewards."""

    name: Literal["env"] = Field("env", description=NAME)
    env: str = Field(
        description="The environment: a name of ascent.envs.ENVIRONMENTS or pkg.module:Class (a row's own "
        "`env` column wins). It gives the prompt and the rewards; reward.fn is not used."
    )
    max_turns: int = Field(4, gt=0, description=MAX_TURNS)
    max_episode_tokens: int = Field(512, gt=0, description=MAX_EPISODE_TOKENS)
    sims_per_worker: int = Field(
        0,
        ge=0,
        description="Simulator episodes (env `gym`) each environment worker steps together through "
        "gymnasium's vector API, as blocks of this many copies (a process or Ray actor holds one or more "
        "blocks; a simulator that crashes costs its block's episodes and the worker is restarted). 0: one "
        "environment per episode, stepped one call each. Used when every episode of a batch is a `gym` one.",
    )

    @property
    def label(self) -> str:
        """How messages name this source."""
        return f"rollout.source.env={self.env!r}"


class AgentSourceConfig(SourceChoice):
    """An agent written against the OpenAI API, played through the run's own endpoint."""

    name: Literal["agent"] = Field("agent", description=NAME)
    agent: str = Field(
        description="`pkg.module:run`, a function run(client, row) (async with an openai.AsyncOpenAI client, "
        "or plain with openai.OpenAI) that returns the episode's reward, or None to let reward.fn score its "
        "last reply. The run serves the policy on a local endpoint; each episode's calls are recorded "
        "token-exact and become one multi-turn episode."
    )
    timeout_s: float = Field(
        300.0, gt=0, description="Most seconds one episode (one run(client, row)) may take."
    )
    concurrency: int = Field(32, gt=0, description="Episodes one agent process runs at once (asyncio).")
    max_turns: int = Field(4, gt=0, description=MAX_TURNS)
    max_episode_tokens: int = Field(512, gt=0, description=MAX_EPISODE_TOKENS)

    @property
    def label(self) -> str:
        """How messages name this source."""
        return f"rollout.source.agent={self.agent!r}"


SOURCE_CHOICES: dict[str, type[SourceChoice]] = {
    "prompt": PromptSourceConfig,
    "env": EnvSourceConfig,
    "agent": AgentSourceConfig,
}
DEFAULT_SOURCE = "prompt"


def _tag(value: Any) -> str | None:
    """The member's tag for a bare name, a mapping or a member (None: pydantic names the unknown source)."""
    name: Any = value
    if isinstance(value, dict):
        name = value.get("name")
    elif not isinstance(value, str):
        name = getattr(value, "name", None)
    return SOURCE_CHOICES[name].__name__ if isinstance(name, str) and name in SOURCE_CHOICES else None


# Each member is tagged with its class name (`ascent.config.fields.choice_members` reads the tags).
Source = Annotated[
    Annotated[PromptSourceConfig, Tag("PromptSourceConfig")]
    | Annotated[EnvSourceConfig, Tag("EnvSourceConfig")]
    | Annotated[AgentSourceConfig, Tag("AgentSourceConfig")],
    Discriminator(
        _tag,
        custom_error_type="unknown_choice",
        custom_error_message="must be one of prompt, env, agent, as a name or as {name: ..., <its settings>}",
    ),
]

# The flat `rollout` fields of the versions before the union -> the source setting each became.
LEGACY_FIELDS = {
    "env": "env",
    "agent": "agent",
    "agent_timeout_s": "timeout_s",
    "agent_concurrency": "concurrency",
    "max_turns": "max_turns",
    "max_episode_tokens": "max_episode_tokens",
}


def spell(source: dict[str, Any]) -> str:
    """`{name: env, env: guess_number, max_turns: 3}`: a source as flow YAML, name first, text unquoted where
    YAML reads it back as the same text, else in double quotes (valid in a file and, in single quotes, as the
    value of an override). `...` stands for a value to fill in."""
    return "{" + ", ".join(f"{k}: {_plain(v)}" for k, v in source.items()) + "}"


def _plain(value: Any) -> str:
    if value is Ellipsis:
        return "..."
    if not isinstance(value, str):
        return show_value(value)
    try:
        same = yaml.safe_load(f"{{v: {value}}}") == {"v": value}
    except yaml.YAMLError:
        same = False
    return value if same else json.dumps(value)


def nest_legacy(rollout: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A `rollout` mapping with the older flat source fields as `rollout.source`; also (the old fields
    found). The source is the agent when `agent` is set, else the environment when `env` is, else prompts;
    an old field the chosen source does not read is dropped."""
    old = {key: rollout[key] for key in LEGACY_FIELDS if key in rollout}
    if not old:
        return rollout, {}
    name = "agent" if old.get("agent") is not None else "env" if old.get("env") is not None else "prompt"
    reads = SOURCE_CHOICES[name].model_fields
    source = {"name": name} | {
        LEGACY_FIELDS[k]: v for k, v in old.items() if v is not None and LEGACY_FIELDS[k] in reads
    }
    out = {k: v for k, v in rollout.items() if k not in LEGACY_FIELDS} | {"source": source}
    return out, old


def legacy_problem(rollout: dict[str, Any]) -> str | None:
    """The problem naming the older flat source fields of a `rollout` mapping and their new spelling (None
    when it has none)."""
    nested, old = nest_legacy(rollout)
    if not old:
        return None
    listed = ", ".join(f"rollout.{k}={show_value(v)}" for k, v in old.items())
    new = spell(nested["source"])
    both = " (an earlier rollout.source is there too: keep one)" if "source" in rollout else ""
    return (
        f"{listed}: the episode source is one setting now, rollout.source, holding only its own fields "
        f"(prompt; env: env, max_turns, max_episode_tokens; agent: agent, timeout_s, concurrency, max_turns, "
        f"max_episode_tokens){both}. Remove {', '.join(f'rollout.{k}' for k in old)} and write "
        f"`source: {new}` under `rollout:` in the YAML, or the override rollout.source='{new}'."
    )


def source_problems(source: Any) -> list[str]:
    """Settings of `rollout.source` (a mapping) that its chosen source does not read, each with the fix."""
    if not isinstance(source, dict):
        return []
    name = source.get("name", DEFAULT_SOURCE)
    member = SOURCE_CHOICES.get(name) if isinstance(name, str) else None
    if member is None:
        return []  # pydantic names an unknown source
    out = []
    for key, value in source.items():
        readers = [n for n, m in SOURCE_CHOICES.items() if key in m.model_fields and key != "name"]
        if key in member.model_fields or not readers:
            continue  # read, or unknown to every source (pydantic reports the unknown key)
        who = readers[0] if len(readers) == 1 else " or ".join(readers)
        example = {"name": readers[0]} | ({} if key == readers[0] else {readers[0]: ...}) | {key: value}
        out.append(
            f"rollout.source.{key}={show_value(value)}: only source={who} reads it, and this run's source is "
            f"{name}; remove it or set rollout.source: {spell(example)}."
        )
    return out
