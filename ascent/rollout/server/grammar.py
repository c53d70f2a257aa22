"""Constrained decoding for the endpoint (`ascent.rollout.server`): `response_format` (a JSON object, a JSON
schema) and vLLM's `guided_json`, `guided_regex`, `guided_choice` become a grammar the sampled tokens follow.

Two halves. In the front end, `request_grammar` turns the request's field into an llguidance grammar (a JSON
string that travels in `SamplingParams.grammar`, so it crosses to the engine's process like any other
parameter); a schema that does not compile is a 400 naming the field. In the engine's process, the
constraint factory of `ascent.rollout.constraints` masks each sampled row to what the grammar allows next.
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
