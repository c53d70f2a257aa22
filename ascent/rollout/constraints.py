"""Grammar constraints for an engine's sampling: `LLGuidanceConstraints` is the constraint factory an engine
is given (`ReferenceEngine.constraints`), making per sampled row a `GrammarConstraint` over an llguidance
matcher: the tokens that may come next (`allowed`), and the tokens sampled (`advance`). The grammar arrives
compiled, in `SamplingParams.grammar`: from the endpoint (`ascent.rollout.server.grammar`: response_format,
guided decoding) or from a run's `rollout.grammar` (every model turn of its episodes). `ascent.rollout.sampling`
masks the rest before sampling; the recorded logprobs stay those of the unmasked distribution, the convention
the trainer recomputes. Once the grammar is complete (or broken) only the end-of-turn token is allowed.

Why llguidance: see `ascent.rollout.server.grammar`.
"""

from __future__ import annotations

from typing import Any

import llguidance
import llguidance.hf
import torch
from torch import Tensor


class GrammarConstraint:
    """One sampled row's grammar state; see `ascent.rollout.reference.TokenConstraint`."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int, eos: list[int]) -> None:
        self.matcher, self.vocab_size, self.eos = matcher, vocab_size, eos

    def allowed(self) -> Tensor:
        """[V] bool: the tokens the grammar allows next (only end-of-turn once it is complete or broken)."""
        out = torch.zeros(self.vocab_size, dtype=torch.bool)
        if self.matcher.is_error():
            out[self.eos] = True
            return out
        bias = torch.frombuffer(bytearray(self.matcher.compute_logit_bias()), dtype=torch.uint8)
        n = min(self.vocab_size, bias.numel())
        out[:n] = bias[:n] > 0
        return out

    def advance(self, token: int) -> None:
        self.matcher.consume_token(token)  # a refused token leaves it in error: only end-of-turn follows


class LLGuidanceConstraints:
    """The constraint factory an engine is given: `(grammar, vocab_size) -> GrammarConstraint`. The llguidance
    tokenizer is built from `tokenizer` (a fast Hugging Face one) on first use and kept per vocabulary
    size."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos = [int(tokenizer.eos_token_id)]
        self._ll: dict[int, Any] = {}

    def __call__(self, grammar: str, vocab_size: int) -> GrammarConstraint:
        if vocab_size not in self._ll:
            # one end token as an int: llguidance < 1.7 (the manylinux_2_28 wheels) takes no list
            self._ll[vocab_size] = llguidance.hf.from_tokenizer(
                self.tokenizer, n_vocab=vocab_size, eos_token=self.eos[0]
            )
        return GrammarConstraint(llguidance.LLMatcher(self._ll[vocab_size], grammar), vocab_size, self.eos)
