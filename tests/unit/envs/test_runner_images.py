"""Images through the multi-turn runner, tokens in and tokens out: the prompt's image and each tool's images
become runs of image tokens (one run per image, each as long as its image's token count) with their
`ImageInput`s beside the ids, every request carries all images so far, the history is never re-tokenised,
and the failure paths (a text model shown an image, a model that samples a placeholder) cost one episode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ascent.data import render_sft_examples
from ascent.envs import ChatTokens, StepResult, Task, run_episodes
from ascent.envs.image_env import ZoomQa
from ascent.envs.images import image_part, text_part
from ascent.envs.tasks.zoom_task import demonstration, make_zoom_task
from ascent.envs.tools.image_tools import load_image
from ascent.messages import Episode, Generation, GenerationRequest, SamplingParams
from ascent.models import make_tiny_checkpoint
from ascent.models.loading import load_tokenizer
from ascent.models.tiny import DEFAULT_CHARS
from ascent.models.tiny_vl import make_tiny_vl_checkpoint
from ascent.models.vision import ImageCodec, load_image_codec

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=200, seed=0)


@pytest.fixture(scope="module")
def vl(tmp_path_factory: pytest.TempPathFactory) -> tuple[ChatTokens, ImageCodec]:
    words = ("<tool_call>", "</tool_call>", "<answer>", "</answer>")
    path = make_tiny_vl_checkpoint(tmp_path_factory.mktemp("vl"), chars=DEFAULT_CHARS + "{}", words=words)
    return ChatTokens(load_tokenizer(path)), load_image_codec(path)


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    path = make_zoom_task(tmp_path_factory.mktemp("zoom"), 4, seed=2, n_val=1)
    return [json.loads(line) for line in path.read_text().splitlines()]


class Script:
    """Answers request i with the next text of episode i's script (then the end-of-turn token), recording
    every request; a script entry that is a list of ids is sent as is."""

    def __init__(self, chat: ChatTokens, scripts: list[list[Any]]) -> None:
        self.chat, self.scripts, self.requests = chat, scripts, []
        self.turn = [0] * len(scripts)

    def __call__(self, requests: list[GenerationRequest]) -> list[list[Generation]]:
        self.requests.append(requests)
        out = []
        for r in requests:
            step = self.scripts[r.request_id][self.turn[r.request_id]]
            self.turn[r.request_id] += 1
            ids = step if isinstance(step, list) else self.chat.turn_ids(step)
            out.append([Generation(ids, [-0.5] * len(ids), "stop")])
        return out


def pad_runs(ids: list[int], pad: int) -> list[int]:
    """The lengths of the runs of `pad` in `ids`, in order."""
    runs, length = [], 0
    for t in [*ids, -1]:
        if t == pad:
            length += 1
        elif length:
            runs, length = [*runs, length], 0
    return runs


def assert_aligned(ids: list[int], images: tuple[Any, ...], pad: int) -> None:
    assert pad_runs(ids, pad) == [im.num_tokens for im in images]


def zoom_call(bbox: list[float]) -> str:
    return f"<tool_call>{json.dumps({'name': 'zoom_in', 'arguments': {'bbox': bbox}})}</tool_call>"


def test_tool_images_enter_the_next_turn_as_image_tokens(vl, rows) -> None:
    chat, codec = vl
    row = {**rows[0], "zoom_size": 112}  # a small crop comes back 112 px long
    box = {"top-left": [0, 0, 0.5, 0.5], "top-right": [0.5, 0, 1, 0.5]}
    box |= {"bottom-left": [0, 0.5, 0.5, 1], "bottom-right": [0.5, 0.5, 1, 1]}
    script = [zoom_call(box[row["quarter"]]), zoom_call([0, 0, 16, 32]), f"<answer>{row['answer']}</answer>"]
    engine = Script(chat, [script])
    (ep,) = run_episodes(
        [Task(ZoomQa(), row, 0)], engine, chat, PARAMS, max_turns=5, max_tokens=2000, images=codec
    )
    assert ep.reward == 1.0 and ep.finish_reason == "stop" and ep.metadata["turns"] == 3
    assert len(ep.images) == 3 and ep.images[0].source == "row 1 image 0"
    assert ep.images[1].source == "row 1 turn 1 image 0" and ep.images[2].source == "row 1 turn 2 image 0"
    # the image and its quarter (224 px, kept: zooms never shrink) at the budget's 64; 16 x 32 px -> 56 x 112
    assert [im.num_tokens for im in ep.images] == [64, 64, 8]
    assert_aligned(ep.prompt_ids + ep.response_ids, ep.images, codec.image_token_id)
    first, second, third = (calls[0] for calls in engine.requests)
    assert [len(r.images) for r in (first, second, third)] == [1, 2, 3]
    assert second.images[:1] == first.images and third.images[:2] == second.images
    for r in (first, second, third):  # each request: the ids so far, all their images, aligned
        assert_aligned(r.prompt_ids, r.images, codec.image_token_id)
        assert (
            r.prompt_ids == (ep.prompt_ids + ep.response_ids)[: len(r.prompt_ids)]
        )  # appended, never redone
    observation = [i for i, m in enumerate(ep.loss_mask) if m == 0]
    pads = [i for i, t in enumerate(ep.response_ids) if t == codec.image_token_id]
    assert set(pads) <= set(observation) and len(pads) == 64 + 8  # image tokens are never trained on
    assert sum(ep.loss_mask) == sum(len(chat.turn_ids(t)) for t in script)


def test_images_by_digest_are_the_pixels_the_env_showed(vl, rows) -> None:
    chat, codec = vl
    env = ZoomQa()
    (ep,) = run_episodes(
        [Task(env, rows[1], 0)],
        Script(chat, [[zoom_call([0, 0, 1, 1]), "<answer>no</answer>"]]),
        chat,
        PARAMS,
        max_turns=3,
        max_tokens=2000,
        images=codec,
    )
    assert [im.digest for im in ep.images] == [codec.encode(im).digest for im in env.seen]


class ShowsAnImage:
    """A text prompt, then an image in its observation."""

    def reset(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "user", "content": "look"}]

    def step(self, action: str) -> StepResult:
        picture = np.zeros((40, 40, 3), dtype=np.uint8)
        return StepResult(({"role": "tool", "content": [text_part("here"), image_part(picture)]},))


def test_an_image_for_a_text_model_costs_the_episode(tmp_path: Path) -> None:
    chat = ChatTokens(load_tokenizer(make_tiny_checkpoint(tmp_path, seed=1)))
    (ep,) = run_episodes(
        [Task(ShowsAnImage(), {}, 0)], Script(chat, [["a", "b"]]), chat, PARAMS, max_turns=3, max_tokens=500
    )
    assert ep.finish_reason == "abort" and "reads no images" in ep.metadata["env_error"]
    assert ep.images == ()


def test_a_sampled_placeholder_is_cut_and_ends_the_episode(vl) -> None:
    chat, codec = vl
    turn = [*chat.turn_ids("ab")[:2], codec.image_token_id, *chat.turn_ids("c")]
    engine = Script(chat, [["x", turn, "never"]])
    (ep,) = run_episodes(
        [Task(ShowsAnImage(), {}, 0)], engine, chat, PARAMS, max_turns=4, max_tokens=2000, images=codec
    )
    assert (
        ep.finish_reason == "abort"
        and ep.metadata["cut"] == "turn 2 sampled the image placeholder at token 2"
    )
    assert len(engine.requests) == 2 and "env_error" not in ep.metadata
    assert_aligned(ep.prompt_ids + ep.response_ids, ep.images, codec.image_token_id)  # one image, one run
    assert ep.response_ids[-2:] == turn[:2] and len(ep.sampler_logprobs) == len(ep.response_ids)


def test_text_episodes_carry_no_images(vl) -> None:
    chat, codec = vl

    class Echo:
        def reset(self, row: dict[str, Any]) -> list[dict[str, str]]:
            return [{"role": "user", "content": "hi"}]

        def step(self, action: str) -> StepResult:
            return StepResult(reward=1.0, done=True)

    with_codec, without = (
        run_episodes(
            [Task(Echo(), {}, 0)], Script(chat, [["ok"]]), chat, PARAMS, max_turns=2, max_tokens=99, **kw
        )[0]
        for kw in ({"images": codec}, {})
    )
    assert isinstance(with_codec, Episode) and with_codec.images == () and with_codec == without


def test_a_demonstration_is_the_episode_zoom_qa_plays(vl, rows) -> None:
    chat, codec = vl
    demo = json.loads(json.dumps(demonstration(rows[0])))  # as sft.jsonl holds it
    assert [m["role"] for m in demo["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    said = [m["content"] for m in demo["messages"] if m["role"] == "assistant"]
    (ep,) = run_episodes(
        [Task(ZoomQa(), rows[0], 0)],
        Script(chat, [said]),
        chat,
        PARAMS,
        max_turns=3,
        max_tokens=2000,
        images=codec,
    )
    assert ep.reward == 1.0
    parts = [p for m in demo["messages"] if isinstance(m["content"], list) for p in m["content"]]
    pictures = [load_image(p["image"]) for p in parts if p["type"] == "image"]
    assert len(pictures) == 2 and all(p["image"].startswith("data:image/png") for p in parts if "image" in p)
    assert [codec.encode(p).digest for p in pictures] == [im.digest for im in ep.images]
    # `ascent sft` trains on exactly these ids: the first request's prompt, the turns, the mask, the images
    (sample,) = render_sft_examples([demo], chat.tok, max_prompt_tokens=2000, codec=codec)
    assert (sample.prompt_ids, sample.response_ids) == (ep.prompt_ids, ep.response_ids)
    assert sample.loss_mask == ep.loss_mask and sum(sample.loss_mask) < len(sample.response_ids)
    assert [im.digest for im in sample.images] == [im.digest for im in ep.images]
