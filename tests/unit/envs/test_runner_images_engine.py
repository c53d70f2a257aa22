"""A tiny Qwen-VL model through the multi-turn runner on the reference engine: images shown by the prompt and
by every observation align with their image-token runs across turns, and the sampler's logprobs of each model
turn are the model's own teacher-forced ones over the whole episode with all its images (what the trainer
scores), so turns appended as ids and images keep the multimodal positions right."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from ascent.envs import ChatTokens, StepResult, Task, run_episodes
from ascent.envs.images import image_part, text_part
from ascent.messages import SamplingParams
from ascent.models.loading import load_tokenizer
from ascent.models.multimodal import vision_inputs
from ascent.models.tiny_vl import make_tiny_vl_checkpoint
from ascent.models.vision import load_image_codec
from ascent.rollout import build_engine
from tests.unit.envs.test_runner_images import assert_aligned


class Shows:
    """An image in the prompt and another, of another size, after every turn, for `turns` turns."""

    def __init__(self, turns: int = 3) -> None:
        self.turns, self.seen = turns, 0

    def reset(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        picture = np.full((60 + 10 * row["k"], 90, 3), 40 * row["k"], dtype=np.uint8)
        return [{"role": "user", "content": [image_part(picture), text_part("what?")]}]

    def step(self, action: str) -> StepResult:
        self.seen += 1
        if self.seen >= self.turns:
            return StepResult(reward=1.0, done=True)
        rng = np.random.default_rng(self.seen)
        picture = rng.integers(0, 256, (30 * self.seen + 20, 50, 3), dtype=np.uint8)
        return StepResult(({"role": "tool", "content": [text_part("see"), image_part(picture)]},))


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_image_episodes_on_the_reference_engine(family: str, tmp_path) -> None:
    path = make_tiny_vl_checkpoint(tmp_path, family=family, seed=1)
    chat, codec = ChatTokens(load_tokenizer(path)), load_image_codec(path)
    engine = build_engine("reference", model_path=path, device="cpu")
    tasks = [Task(Shows(), {"k": k}, k) for k in range(2)]
    # a random model seldom ends a turn: every odd text token ends one (12 tokens without: 1 in 4096)
    stops = tuple(range(codec.image_token_id + 3, len(chat.tok), 2))
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=3, stop_token_ids=stops)
    episodes = run_episodes(tasks, engine.generate, chat, params, max_turns=3, max_tokens=500, images=codec)
    model = engine.model
    for ep in episodes:
        ids = ep.prompt_ids + ep.response_ids
        assert_aligned(ids, ep.images, codec.image_token_id)
        sources = [f"row {ep.row_id + 1} image 0", *(f"row {ep.row_id + 1} turn {t} image 0" for t in (1, 2))]
        assert [im.source for im in ep.images] == sources[: len(ep.images)]
        x = torch.tensor([ids])
        with torch.no_grad():
            logits = model(input_ids=x, **vision_inputs(model, x, ep.images, x.device)).logits[0]
        logp = torch.log_softmax(logits.float(), -1)[len(ep.prompt_ids) - 1 : -1]
        scored = logp.gather(-1, torch.tensor(ep.response_ids)[:, None])[:, 0]
        sampled = [i for i, m in enumerate(ep.loss_mask) if m]
        torch.testing.assert_close(
            scored[sampled], torch.tensor(ep.sampler_logprobs)[sampled], atol=1e-4, rtol=0
        )
    assert any(len(ep.images) == 3 for ep in episodes)  # some episode got through every turn
