"""Constrained decoding for the endpoint (`ascent.rollout.server`): `response_format` (a JSON object, a JSON
schema) and vLLM's `guided_json`, `guided_regex`, `guided_choice` become a grammar the sampled tokens follow.

Two halves. In the front end, `request_grammar` turns the request's field into an llguidance grammar (a JSON
string that travels in `SamplingParams.grammar`, so it crosses to the engine's process like any other
parameter); a schema that does not compile is a 400 naming the field. In the engine's process,
`LLGuidanceConstraints` is the engine's constraint factory: per sampled row, an llguidance matcher gives the
tokens that may come next (`allowed`) and follows the tokens sampled (`advance`); `ascent.rollout.sampling`
masks the rest before sampling (the recorded logprobs stay those of the unmasked distribution, the
convention the trainer recomputes). Once the grammar is complete only the end-of-turn token is allowed.
Engines that take no constraint factory (the fast GPU engine) refuse these fields by name.

We chose llguidance (the Rust library behind Guidance, also used by vLLM and SGLang): one 3 MB wheel with no
Python dependencies, for every CPython from 3.9 (abi3), computing a step's mask in microseconds from any
fast Hugging Face tokenizer. xgrammar needs torch extensions and more packages.
"""

from __future__ import annotations

import json
import re
from typing import Any

import llguidance
import llguidance.hf
import torch
from torch import Tensor

from ascent.rollout.server.errors import APIError, bad_request
from ascent.rollout.server.schemas import GRAMMAR_FIELDS

_COMPACT = {"whitespace_flexible": False}  # no free whitespace between JSON tokens: short replies


def _schema_of(name: str, value: Any) -> dict[str, Any] | None:
    """The JSON schema a field asks for (None: free text); a 400 for a value it cannot be."""
    if name == "guided_json":
        schema = json.loads(value) if isinstance(value, str) else value
        if not isinstance(schema, dict):
            raise bad_request(f"guided_json: give a JSON schema (an object), not {value!r}.", name)
        return schema
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        schema = (value.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise bad_request("response_format.json_schema.schema: give the JSON schema (an object).", name)
        return schema
    raise bad_request(f"response_format={value!r}: type must be text, json_object or json_schema.", name)


def _grammar_of(name: str, value: Any) -> str | None:
    if name == "guided_regex":
        return str(llguidance.LLMatcher.grammar_from_regex(str(value)))
    if name == "guided_choice":
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise bad_request("guided_choice: give a non-empty list of strings.", name)
        return str(llguidance.LLMatcher.grammar_from_regex("|".join(re.escape(v) for v in value)))
    schema = _schema_of(name, value)
    if schema is None:
        return None
    return str(
        llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_COMPACT)  # type: ignore[arg-type]
    )


def request_grammar(extra: dict[str, Any], supported: bool) -> str | None:
    """The llguidance grammar a request's extra fields ask for (None: none); a 400 naming the field when it
    is malformed, when two are given, or when the engine cannot constrain its sampling (`supported`)."""
    asked = [(name, extra[name]) for name in GRAMMAR_FIELDS if extra.get(name) is not None]
    if len(asked) > 1:
        names = " and ".join(name for name, _ in asked)
        raise bad_request(f"{asked[1][0]}: give one of {names}, not both.", asked[1][0])
    if not asked:
        return None
    name, value = asked[0]
    grammar = _grammar_of(name, value)
    if grammar is None:
        return None
    if not supported:
        raise APIError(
            400,
            f"{name}: this server's engine cannot constrain its sampling (the fast GPU engine "
            "and a training run's endpoint have no grammar mask); serve with --engine reference, or "
            "leave it out and validate the reply yourself.",
            param=name,
            code="unsupported_parameter",
        )
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise bad_request(f"{name}: the schema cannot be compiled into a grammar: {error}", name)
    return grammar


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
            self._ll[vocab_size] = llguidance.hf.from_tokenizer(
                self.tokenizer, n_vocab=vocab_size, eos_token=self.eos
            )
        return GrammarConstraint(llguidance.LLMatcher(self._ll[vocab_size], grammar), vocab_size, self.eos)
