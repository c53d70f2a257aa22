"""The loop's stages on frozen messages: each returns new groups and leaves its input as it was; a group's
identity is its place in the list, whatever its size (multi-turn, partial and regenerated groups differ)."""

from __future__ import annotations

import dataclasses
import functools
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from ascent.config import RunConfig
from ascent.messages import (
    Episode,
    Generation,
    Group,
    ImageInput,
    SamplingParams,
    TrainSample,
    flatten,
    regroup,
)
from ascent.orchestrator import batch as B
from ascent.orchestrator import collector as C
from ascent.orchestrator import shaping
from ascent.orchestrator.sampling import Scorer
from ascent.orchestrator.specs import collect_spec
from ascent.rewards import RewardRunner


def ep(reward: float = 0.0, n: int = 3, finish: str = "stop", row_id: int = 0, text: str = "") -> Episode:
    return Episode(
        prompt_ids=[1, 2],
        response_ids=[5] * n,
        sampler_logprobs=[-0.5] * n,
        loss_mask=[1] * n,
        finish_reason=finish,
        row_id=row_id,
        reward=reward,
        response_text=text,  # type: ignore[arg-type]
        metadata={"answer": "4"},
    )


def config(**algorithm: Any) -> RunConfig:
    return RunConfig(
        rollout={"prompts_per_step": 2, "samples_per_prompt": 2, "max_new_tokens": 4},
        train={"trajectories_per_update": 4},
        algorithm=algorithm,
    )


def test_messages_are_frozen() -> None:
    e = ep()
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.reward = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Group((e,)).baseline_reward = 0.5  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Generation([1], [0.0], "stop").token_versions = [3]  # type: ignore[misc]


def test_regroup_keeps_each_groups_size_and_refuses_a_wrong_count() -> None:
    groups = [Group((ep(0), ep(1), ep(2))), Group((ep(3),))]
    again = regroup(groups, [dataclasses.replace(e, reward=e.reward + 10) for e in flatten(groups)])
    assert [[e.reward for e in g.episodes] for g in again] == [[10, 11, 12], [13]]
    with pytest.raises(ValueError, match="3 episodes for groups of"):
        regroup(groups, flatten(groups)[:3])


def test_score_returns_rewarded_groups_and_leaves_its_input() -> None:
    groups = [Group((ep(text="4"), ep(text="5"))), Group((ep(text="four", row_id=1),))]
    scored, metrics = Scorer(RewardRunner("exact_match"), decode=lambda ids: "")(groups)
    assert [[e.reward for e in g.episodes] for g in scored] == [[1.0, 0.0], [0.0]]
    assert all(e.reward == 0.0 for e in flatten(groups))  # the input is untouched
    assert metrics["reward/mean"] == pytest.approx(1 / 3)


def test_shape_rewards_penalises_overlong_and_masks_truncated_in_new_groups() -> None:
    cfg = config(overlong_buffer=2, overlong_penalty=1.0, mask_truncated=True)
    groups = [Group((ep(1.0, n=2), ep(1.0, n=4, finish="length"))), Group((ep(0.0, n=3),))]
    shaped = shaping.shape_rewards(collect_spec(cfg).shaping, groups)
    (short, long), (mid,) = (g.episodes for g in shaped)
    assert short.reward == 1.0 and short.loss_mask == [1, 1]
    assert long.reward == pytest.approx(0.0) and long.loss_mask == [0] * 4  # -1 at the limit; masked
    assert mid.reward == pytest.approx(-0.5) and mid.reward_components["overlong_penalty"] == -0.5
    assert [e.reward for e in flatten(groups)] == [1.0, 1.0, 0.0]  # the input is untouched
    assert flatten(groups)[1].loss_mask == [1] * 4 and flatten(groups)[2].reward_components == {}


def test_advantages_group_by_place_whatever_the_group_sizes() -> None:
    """Groups of 3, 1 and 2 episodes (an index // samples_per_prompt rule would mix them)."""
    groups = [Group((ep(1.0), ep(0.0), ep(0.0))), Group((ep(1.0),)), Group((ep(0.0), ep(1.0)))]
    adv, _ = B.compute_advantages(groups, B.advantage_of(RunConfig().algorithm))
    first = adv[:, 0]
    g0 = torch.tensor([1.0, 0.0, 0.0])
    want0 = (g0 - g0.mean()) / (g0.std() + 1e-6)
    assert torch.allclose(first[:3], want0, atol=1e-5)
    assert first[3] == 0.0  # a group of one has no one to compare with
    assert first[4] < 0 < first[5] and first[4] == pytest.approx(-first[5])
    assert B.group_ids(groups).tolist() == [0, 0, 0, 1, 2, 2]


def test_remax_baseline_is_the_groups() -> None:
    groups = [Group((ep(1.0), ep(0.0)), baseline_reward=0.5), Group((ep(1.0),), baseline_reward=1.0)]
    inp = B.advantage_inputs(groups)
    assert inp.baseline_rewards is not None and inp.baseline_rewards.tolist() == [0.5, 0.5, 1.0]
    assert B.advantage_inputs([Group((ep(),))]).baseline_rewards is None


def test_dynamic_sampling_keeps_groups_with_signal() -> None:
    flat, mixed, single = Group((ep(1.0), ep(1.0))), Group((ep(1.0), ep(0.0))), Group((ep(0.0),))
    assert C._groups_with_signal([flat, mixed, single]) == [mixed]
    assert C._groups_with_signal([]) == []


def test_filter_zero_advantage_masks_copies() -> None:
    samples = [TrainSample([1], [2, 3], [1, 1], [0.0, 0.0]), TrainSample([1], [2, 3], [1, 0], [0.5, 0.0])]
    out, metrics = B.filter_zero_advantage(samples)
    assert out[0].loss_mask == [0, 0] and out[1] is samples[1] and samples[0].loss_mask == [1, 1]
    assert metrics == {"filter/zero_advantage_frac": 0.5}


def test_to_groups_makes_one_group_per_prompt_in_engine_order() -> None:
    items = [
        SimpleNamespace(prompt_ids=[1], row_id=7, metadata={}),
        SimpleNamespace(prompt_ids=[2], row_id=9, metadata={}),
    ]
    gens = [
        [Generation([4], [-0.1], "stop", [2]), Generation([5, 6], [-0.2, -0.3], "length", [1, 2])],
        [Generation([8], [-0.4], "stop")],
    ]
    groups = B.to_groups(items, gens, decode=str, policy_version=3)
    assert [g.row_id for g in groups] == [7, 9] and [len(g.episodes) for g in groups] == [2, 1]
    a, b = groups[0].episodes
    assert a.policy_version == 2 and b.policy_version == 1 and b.token_versions == [1, 2]
    assert groups[1].episodes[0].policy_version == 3  # no versions from the engine: the argument
    assert b.finish_reason == "length" and b.response_text == "[5, 6]"


def test_shard_requests_keeps_each_request_id_on_one_replica_and_restores_order() -> None:
    from ascent.messages import GenerationRequest, SamplingParams

    def requests(ids: list[int]) -> list[GenerationRequest]:
        return [GenerationRequest([i + 1], SamplingParams(), request_id=i) for i in ids]

    turn1, turn2 = requests(list(range(7))), requests([1, 2, 4, 5])  # episodes 0, 3, 6 ended
    for reqs in (turn1, turn2):
        shards, positions = B.shard_requests(reqs, 3)
        assert all(r.request_id % 3 == w for w, shard in enumerate(shards) for r in shard)
        flat = [r for shard in shards for r in shard]
        assert [flat[k] for k in positions] == reqs
    assert B.shard_requests(turn2, 3)[0][0] == []  # nothing left for replica 0: an empty shard


def _turns_ep(turn_rewards: list[float], reward: float) -> Episode:
    """Three model turns (tokens 0-1, 4-6, 8) with observations (2-3, 7) between them."""
    mask = [1, 1, 0, 0, 1, 1, 1, 0, 1]
    return Episode(
        prompt_ids=[1, 2],
        response_ids=[5] * 9,
        sampler_logprobs=[-0.5] * 9,
        loss_mask=mask,
        finish_reason="stop",
        row_id=0,
        reward=reward,
        metadata={"turn_rewards": turn_rewards},
    )


def test_token_level_estimators_place_each_turns_reward_at_the_end_of_its_turn() -> None:
    """reinforce_pp, gamma 1: a token's return is the rewards of its own turn and the later ones (0.5 + 0.25 +
    1.0 for turn 1, 1.25 for turn 2, 1.0 for turn 3); an outcome estimator (GRPO) sees the sum; a failed
    episode (reward 0 whatever its turns gave) keeps the outcome placement."""
    groups = [Group((_turns_ep([0.5, 0.25, 1.0], 1.75), _turns_ep([0.0, 0.0, 1.0], 1.0)))]
    _, returns = B.compute_advantages(
        groups, B.advantage_of(RunConfig(algorithm={"advantage": "reinforce_pp"}).algorithm)
    )
    assert returns[0].tolist() == pytest.approx([1.75, 1.75, 0, 0, 1.25, 1.25, 1.25, 0, 1.0])
    assert returns[1].tolist() == pytest.approx([1.0, 1.0, 0, 0, 1.0, 1.0, 1.0, 0, 1.0])
    adv, _ = B.compute_advantages(
        groups, B.advantage_of(RunConfig().algorithm)
    )  # grpo on the sums 1.75 vs 1.0
    assert adv[0, 0] > 0 > adv[1, 0] and adv[0, 0] == pytest.approx(adv[0, 8])
    failed = [Group((_turns_ep([0.5, 0.25], 0.0), _turns_ep([0.0, 0.0, 1.0], 1.0)))]
    _, returns = B.compute_advantages(
        failed, B.advantage_of(RunConfig(algorithm={"advantage": "reinforce_pp"}).algorithm)
    )
    assert returns[0].abs().max() == 0.0


@pytest.mark.parametrize(
    ("algorithm", "name", "opts"),
    [
        ({}, "grpo", {"scale_by_std": True, "std_over_batch": False, "adv_eps": 1e-6}),
        ({"scale_by_std": False}, "grpo", {"scale_by_std": False, "std_over_batch": False, "adv_eps": 1e-6}),
        (
            {"advantage": {"name": "grpo", "scale_by_std": False}},
            "grpo",
            {"scale_by_std": False, "std_over_batch": False, "adv_eps": 1e-6},
        ),
        (
            {"advantage": "gae", "gamma": 0.99, "lam": 0.95},
            "gae",
            {"gamma": 0.99, "lam": 0.95, "gae_whiten": True, "shift_mean": True, "adv_eps": 1e-6},
        ),
        ({"advantage": {"name": "remax", "gamma": 0.9}}, "remax", {"gamma": 0.9}),
        ({"advantage": "rloo"}, "rloo", {}),
    ],
)
def test_the_estimator_gets_its_choices_settings(monkeypatch, algorithm, name, opts) -> None:
    """The settings of `algorithm.advantage` (flat in older configs) reach the estimator, and no others."""
    seen: dict[str, Any] = {}
    real = B.ADVANTAGE_ESTIMATORS[name]

    @functools.wraps(real)
    def recording(inp: Any, **kwargs: Any) -> Any:
        seen.update(kwargs)
        return real(inp, **kwargs)

    monkeypatch.setitem(B.ADVANTAGE_ESTIMATORS, name, recording)
    cfg = RunConfig(algorithm=algorithm)
    groups = [Group((ep(1.0), ep(0.0)), baseline_reward=0.5)]
    values = torch.zeros(2, 3) if name == "gae" else None
    B.compute_advantages(groups, B.advantage_of(cfg.algorithm), values=values)
    assert seen == opts


def test_a_prompts_images_reach_its_requests_episodes_and_train_samples() -> None:
    image = ImageInput(pixel_values=None, grid_thw=(1, 4, 4), num_tokens=4, digest="d", source="a.png")
    items = [SimpleNamespace(prompt_ids=[1, 6, 6, 6, 6], row_id=0, metadata={}, images=(image,))]
    (request,) = B.make_requests([i.prompt_ids for i in items], SamplingParams(n=2), 0, [(image,)])
    assert request.images == (image,)
    groups = B.to_groups(items, [[Generation([4], [-0.1], "stop")] * 2], decode=str)
    assert [e.images for e in groups[0].episodes] == [(image,), (image,)]
    assert [s.images for s in B.train_samples(flatten(groups))] == [(image,), (image,)]
    assert C.item_of(groups[0].episodes[0]).images == (image,)  # regenerated prompts keep their images


def test_an_moe_generations_experts_reach_train_samples_unless_replay_is_off() -> None:
    routed = torch.zeros(3, 2, 2, dtype=torch.int16)  # 2 prompt + 1 response tokens, 2 MoE layers, top 2
    items = [SimpleNamespace(prompt_ids=[1, 2], row_id=0, metadata={})]
    groups = B.to_groups(items, [[Generation([4], [-0.1], "stop", routed_experts=routed)]], decode=str)
    assert groups[0].episodes[0].routed_experts is routed
    assert B.train_samples(flatten(groups))[0].routed_experts is routed  # algorithm.routing_replay=true
    assert B.train_samples(flatten(groups), routing_replay=False)[0].routed_experts is None


@pytest.mark.parametrize("fill", [0.0, -1.0])
def test_padded_matches_a_row_by_row_copy(fill) -> None:
    """Ragged rows (empty ones, full-width ones) -> [B, width] float32, each row's values then `fill`."""
    rows = [[0.5, -2.0, 3.25], [], [1.0, 2.0, 3.0, 4.0], [7.0]]
    want = torch.full((4, 4), fill)
    for i, r in enumerate(rows):
        want[i, : len(r)] = torch.tensor(r)
    got = B.padded(rows, 4, fill)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert B.padded([], 3).shape == (0, 3)


def test_with_targets_slices_each_row_to_its_response() -> None:
    """Advantages (and, with a critic, returns and values) [B, T] become per-sample lists of each
    response's length; without a critic returns and values stay None."""
    samples = [
        TrainSample(prompt_ids=[1], response_ids=[2, 3], loss_mask=[1, 1], advantages=[0.0, 0.0]),
        TrainSample(prompt_ids=[1], response_ids=[4, 5, 6], loss_mask=[1, 0, 1], advantages=[0.0] * 3),
    ]
    adv = torch.tensor([[0.5, 0.25, 9.0], [1.0, 2.0, 3.0]])
    out = B.with_targets(
        samples, adv, [[-1.0, -2.0], [-3.0, -4.0, -5.0]], None, returns=adv + 1, values=adv - 1
    )
    assert [s.advantages for s in out] == [[0.5, 0.25], [1.0, 2.0, 3.0]]
    assert out[1].returns == [2.0, 3.0, 4.0] and out[0].old_values == [-0.5, -0.75]
    assert out[0].old_logprobs == [-1.0, -2.0] and out[0].ref_logprobs is None
    plain = B.with_targets(samples, adv, None, None)
    assert plain[0].returns is None and plain[1].old_values is None and plain[1].advantages == [1.0, 2.0, 3.0]


def test_the_scorer_decodes_each_prompt_once() -> None:
    """The episodes of a group share their prompt: the reward input's prompt text is decoded once per
    distinct prompt, and every episode gets it."""
    calls: list[tuple[int, ...]] = []

    def decode(ids) -> str:
        calls.append(tuple(ids))
        return "p" + "".join(map(str, ids))

    groups = [Group((ep(text="4"), ep(text="5"))), Group((replace_prompt(ep(text="4", row_id=1), [3]),))]
    seen: list[str] = []
    runner = RewardRunner(lambda prompt, response, ids, meta, **_: seen.append(prompt) or 0.0)
    Scorer(runner, decode=decode)(groups)
    assert sorted(calls) == [(1, 2), (3,)] and seen == ["p12", "p12", "p3"]


def replace_prompt(e: Episode, prompt_ids: list[int]) -> Episode:
    return dataclasses.replace(e, prompt_ids=prompt_ids)


def test_to_groups_decodes_the_responses_in_one_batch_where_the_decoder_can() -> None:
    """A decoder with `many` gets every response of the batch in one call (in engine order); a plain
    callable is called once per response; the texts land on the right episodes either way."""
    items = [SimpleNamespace(prompt_ids=[1], row_id=r, metadata={}) for r in (0, 1)]
    gens = [
        [Generation([4], [-0.1], "stop"), Generation([5, 6], [-0.2, -0.3], "stop")],
        [Generation([8], [-0.4], "stop")],
    ]

    class Batched:
        def __init__(self) -> None:
            self.batches: list[list[list[int]]] = []

        def __call__(self, ids) -> str:
            raise AssertionError("one call per response")

        def many(self, seqs):
            self.batches.append([list(s) for s in seqs])
            return [f"t{s}" for s in seqs]

    batched = Batched()
    groups = B.to_groups(items, gens, decode=batched)
    assert batched.batches == [[[4], [5, 6], [8]]]
    assert [[e.response_text for e in g.episodes] for g in groups] == [["t[4]", "t[5, 6]"], ["t[8]"]]
    assert [[e.response_text for e in g.episodes] for g in B.to_groups(items, gens, decode=str)] == [
        ["[4]", "[5, 6]"],
        ["[8]"],
    ]


def test_text_decoder_batches_exactly_what_decode_gives(tmp_path) -> None:
    """TextDecoder.many (the Rust tokenizer's decode_batch) equals the tokenizer's own decode, special
    tokens skipped, on random ids including the special ones; a tokenizer that cleans up spaces afterwards
    (a Python pass decode_batch lacks) is decoded one sequence at a time."""
    import random

    from transformers import AutoTokenizer

    from ascent.models.tiny import make_char_tokenizer

    make_char_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    rng = random.Random(0)
    seqs = [[rng.randrange(len(tok)) for _ in range(rng.randrange(0, 40))] for _ in range(200)]
    decoder = B.TextDecoder(tok)
    assert decoder.batched
    assert decoder.many(seqs) == [tok.decode(s, skip_special_tokens=True) for s in seqs]
    assert decoder(seqs[3]) == tok.decode(seqs[3], skip_special_tokens=True) and decoder.many([]) == []
    tok.clean_up_tokenization_spaces = True
    assert not B.TextDecoder(tok).batched
