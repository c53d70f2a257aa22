"""A two-turn environment for the multi-turn learning test: the answer is a secret digit the prompt does not
show, so the model cannot know it in its head; asking (`?`) makes the environment reveal it as a tool message,
and repeating it earns 1. Answering at once is a 1-in-10 guess."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ascent.envs import StepResult


class Lookup:
    def reset(self, row: Mapping[str, Any]) -> list[dict[str, str]]:
        self.secret, self.asked = str(row["secret"]), False
        return [{"role": "user", "content": "key"}]

    def step(self, action: str) -> StepResult:
        text = action.strip()
        if text == "?" and not self.asked:
            self.asked = True
            return StepResult(({"role": "tool", "content": self.secret},))
        return StepResult(reward=float(text == self.secret), done=True)


def conversation(secret: int, ask: bool, guess: int) -> dict[str, Any]:
    """A demonstration: ask and repeat the secret, or answer `guess` at once."""
    turns = [{"role": "assistant", "content": "?"}, {"role": "tool", "content": str(secret)}] if ask else []
    answer = str(secret) if ask else str(guess)
    return {
        "messages": [{"role": "user", "content": "key"}, *turns, {"role": "assistant", "content": answer}]
    }


def expected_reward(model_dir: Path, secrets: list[int]) -> float:
    """Mean over rows of P(episode earns 1) at temperature 1: P(ask, then repeat) + P(guess the secret),
    from teacher-forced forwards (exact, not sampled)."""
    import torch
    from transformers import AutoModelForCausalLM

    from ascent.envs import ChatTokens
    from ascent.models.loading import load_tokenizer

    chat = ChatTokens(load_tokenizer(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()

    def p_of(conv: dict[str, Any]) -> float:
        prompt, response, mask = chat.conversation_ids(conv["messages"])
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            logp = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
        chosen = logp.gather(1, torch.tensor(response)[:, None])[:, 0]
        return float((chosen * torch.tensor(mask, dtype=chosen.dtype)).sum().exp())

    wins = [p_of(conversation(s, True, s)) + p_of(conversation(s, False, s)) for s in secrets]
    return sum(wins) / len(wins)


def lookup_run(
    run_dir: Path, data: Path, model: Path, seed: int, iterations: int, **source: str
) -> dict[str, Any]:
    """The GRPO run of the lookup learning tests; `source` is `env=...` or `agent=...` (the episode source's
    name and its own setting)."""
    ((name, where),) = source.items()
    return {
        "run_dir": str(run_dir),
        "seed": seed,
        "iterations": iterations,
        "model": {"path": str(model)},
        "data": {"train_path": str(data), "max_prompt_tokens": 16},
        "rollout": {
            "source": {"name": name, name: where, "max_turns": 2, "max_episode_tokens": 16},
            "max_new_tokens": 4,
            "prompts_per_step": 8,
            "samples_per_prompt": 8,
            "env_workers": 2,
        },
        "train": {"lr": 1e-3, "trajectories_per_update": 32, "max_tokens_per_micro_batch": 1024},
        "tracking": {"progress": False, "tensorboard": False, "trace": False},
    }
