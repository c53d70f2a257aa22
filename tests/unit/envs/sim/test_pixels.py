"""Reach in pixels (`reach_pixels` rows) for a vision-language policy: every observation is the rendered frame
as image tokens, the text leaves the state out, and each turn's request carries every frame so far."""

from __future__ import annotations

from ascent.envs import ChatTokens, Task, run_episodes
from ascent.envs.sim import SimVectorEnvs
from ascent.envs.tasks.control_task import control_rows
from ascent.messages import Generation, SamplingParams
from ascent.models.loading import load_tokenizer
from ascent.models.vision import load_image_codec


def test_pixel_reach_shows_frames_only_and_a_vl_policy_sees_each(vl_processor_dir):
    chat = ChatTokens(load_tokenizer(vl_processor_dir))  # action words spelt in characters
    codec = load_image_codec(vl_processor_dir)
    rows = control_rows("reach_pixels", [3, 3])  # offset +2: two steps right reach the target
    requests = []

    def generate(batch):
        requests.append(batch)
        return [
            [Generation(chat.turn_ids("<a1>"), [-0.7] * len(chat.turn_ids("<a1>")), "stop")] for _ in batch
        ]

    tasks = [Task("gym", row, k) for k, row in enumerate(rows)]
    params = SamplingParams(max_new_tokens=4)
    episodes = run_episodes(
        tasks, generate, chat, params, max_turns=3, max_tokens=2000, images=codec, envs=SimVectorEnvs()
    )
    assert [e.metadata["success"] for e in episodes] == [True, True] and [e.reward for e in episodes] == [
        1,
        1,
    ]
    assert [len(b[0].images) for b in requests] == [1, 2]  # the first frame, then it and the next
    first, second = requests[1][0].images
    assert first.grid_thw == second.grid_thw and first.digest != second.digest  # the point moved
    prompt = chat.decode(requests[0][0].prompt_ids)
    assert "State: (the image)" in prompt and "2" not in prompt.split("State:")[1]
