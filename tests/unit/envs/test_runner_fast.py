"""Multi-turn episodes on the fast engine (CPU, fp32): the same token-exact episodes as the reference engine,
each turn after the first prefilling only the observation (the episode's own cached history is reused, also
when several episodes share a row), the same greedy episodes with and without that reuse (also when a small
KV cache evicts sessions mid-batch), and nothing reused across a weight update."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from ascent.envs import ChatTokens, GuessNumber, Task, run_episodes
from ascent.messages import Episode, SamplingParams
from ascent.models import make_tiny_checkpoint
from ascent.models.loading import load_tokenizer

HEAD_SCALE = 10.0  # random init is near-uniform; a sharper head gives peaked, varied outputs
# even ids end a turn: turns of a few tokens, most of them ended by a stop token (so episodes go on)
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6, stop_token_ids=tuple(range(4, 89, 2)))


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny_fast_envs"), tie_word_embeddings=False, seed=3)


@pytest.fixture(scope="module")
def chat(tiny_path: Path) -> ChatTokens:
    return ChatTokens(load_tokenizer(tiny_path))


def _head(tiny_path: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    return model.get_output_embeddings().weight.detach() * HEAD_SCALE


def engine(tiny_path: Path, chat: ChatTokens, name: str = "fast", **kw: Any) -> Any:
    from ascent.rollout import build_engine

    extra = {"dtype": "fp32", "page_size": 16, "max_model_len": 256} if name == "fast" else {}
    eng = build_engine(
        name,
        model_path=tiny_path,
        device="cpu",
        eos_token_ids=[chat.tok.eos_token_id],
        pad_token_id=0,
        **extra,
        **kw,
    )
    eng.update_weights([("lm_head.weight", _head(tiny_path))])
    return eng


def tasks(*targets: int, row_ids: list[int] | None = None) -> list[Task]:
    ids = row_ids or list(range(len(targets)))
    return [Task(GuessNumber(), {"target": t}, row_id=i) for i, t in zip(ids, targets, strict=True)]


def play(eng: Any, chat: ChatTokens, ts: list[Task], params: SamplingParams = GREEDY) -> list[Episode]:
    return run_episodes(ts, eng.generate, chat, params, max_turns=5, max_tokens=120)


def observations(ep: Episode) -> list[list[int]]:
    """The mask-0 spans of an episode's response: its observations, in order."""
    spans, start = [], None
    for i, m in enumerate([*ep.loss_mask, 1]):
        if m == 0 and start is None:
            start = i
        elif m == 1 and start is not None:
            spans.append(ep.response_ids[start:i])
            start = None
    return spans


def new_tokens(ep: Episode) -> int:
    """Prompt tokens an engine reusing the episode's history computes: the first prompt, then per turn the
    observation and the previous turn's last token (sampled, so its K/V was never written)."""
    return len(ep.prompt_ids) + sum(len(obs) + 1 for obs in observations(ep))


def same_episodes(a: list[Episode], b: list[Episode]) -> None:
    for x, y in zip(a, b, strict=True):
        assert (x.response_ids, x.loss_mask, x.finish_reason) == (
            y.response_ids,
            y.loss_mask,
            y.finish_reason,
        )
        assert x.metadata["turns"] == y.metadata["turns"]
        torch.testing.assert_close(x.sampler_logprobs, y.sampler_logprobs, atol=1e-4, rtol=0)


TARGETS = (3, 8, 5, 1, 7, 0)


def test_fast_engine_episodes_equal_the_reference_engine_and_prefill_only_observations(
    tiny_path: Path, chat: ChatTokens
) -> None:
    fast = engine(tiny_path, chat, max_batch_size=8)
    ref_eps = play(engine(tiny_path, chat, "reference"), chat, tasks(*TARGETS))
    before = fast.stats["prefill_tokens"]
    eps = play(fast, chat, tasks(*TARGETS))
    same_episodes(eps, ref_eps)
    assert sum(ep.metadata["turns"] for ep in eps) >= len(eps) + 4  # several episodes went on past turn 1
    for ep in eps:
        n = len(ep.response_ids)
        assert len(ep.loss_mask) == len(ep.sampler_logprobs) == len(ep.token_versions) == n
        assert len(observations(ep)) == ep.metadata["turns"] - 1
        assert ep.metadata["prompt_tokens"] - ep.metadata["cached_tokens"] == new_tokens(ep)
    assert fast.stats["prefill_tokens"] - before == sum(new_tokens(ep) for ep in eps)
    assert all(ep.metadata["cached_tokens"] == 0 for ep in ref_eps)


@pytest.mark.parametrize("kv_cache_tokens", [4096, 192])
def test_greedy_episodes_with_reuse_equal_those_without(
    tiny_path: Path, chat: ChatTokens, kv_cache_tokens: int
) -> None:
    """Two decode rows for six episodes; 192 cache tokens hold about two episodes, so the others' sessions
    are evicted (and re-prefilled)."""
    reuse = engine(tiny_path, chat, max_batch_size=2, kv_cache_tokens=kv_cache_tokens)
    plain = engine(tiny_path, chat, max_batch_size=2, keep_sessions=False)
    eps = play(reuse, chat, tasks(*TARGETS))
    same_episodes(eps, play(plain, chat, tasks(*TARGETS)))
    cached = sum(ep.metadata["cached_tokens"] for ep in eps)
    assert reuse.stats["reused_tokens"] == cached > 0 and plain.stats["reused_tokens"] == 0
    if kv_cache_tokens == 4096:
        assert all(
            ep.metadata["prompt_tokens"] - ep.metadata["cached_tokens"] == new_tokens(ep) for ep in eps
        )
    else:  # evictions cost re-prefills, never correctness
        assert sum(ep.metadata["prompt_tokens"] - ep.metadata["cached_tokens"] for ep in eps) > sum(
            new_tokens(ep) for ep in eps
        )


def test_episodes_of_one_row_each_reuse_their_own_history(tiny_path: Path, chat: ChatTokens) -> None:
    """samples_per_prompt episodes of a row: different conversations, each continuing its own cache."""
    fast = engine(tiny_path, chat, max_batch_size=8)
    sampled = SamplingParams(temperature=1.0, max_new_tokens=6, seed=7, stop_token_ids=GREEDY.stop_token_ids)
    eps = play(fast, chat, tasks(*[9] * 4, row_ids=[2] * 4), sampled)
    assert len({tuple(ep.response_ids) for ep in eps}) > 1  # the samples diverged
    assert sum(ep.metadata["turns"] > 1 for ep in eps) >= 2
    for ep in eps:
        assert ep.metadata["prompt_tokens"] - ep.metadata["cached_tokens"] == new_tokens(ep)


def test_a_weight_update_drops_cached_sessions(tiny_path: Path, chat: ChatTokens) -> None:
    fast, ref = engine(tiny_path, chat, max_batch_size=8), engine(tiny_path, chat, "reference")
    play(fast, chat, tasks(*TARGETS))
    assert len(fast.sessions) == len(TARGETS)
    new = {n: t * 0.5 for n, t in ref.model.state_dict().items() if "mlp" in n}
    for eng in (fast, ref):
        eng.update_weights(list(new.items()))
    assert len(fast.sessions) == 0
    eps = play(fast, chat, tasks(*TARGETS))  # the same conversations start again: nothing to reuse at turn 1
    same_episodes(eps, play(ref, chat, tasks(*TARGETS)))
    assert all(ep.metadata["prompt_tokens"] - ep.metadata["cached_tokens"] == new_tokens(ep) for ep in eps)
