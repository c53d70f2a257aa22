"""The server's pieces without HTTP: text deltas with stop strings held back, OpenAI field names from
pydantic locations, the context budget, tool-call parsing, the bounded recorder and its sink, the forced
tokens of a record (its loss mask, `--record`'s store, the front ends' wire), and the access rules of
`ascent serve`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from ascent.entrypoints import serve as serve_module
from ascent.entrypoints.serve import ServeError, auto_api_processes, check_access, parse_api_processes
from ascent.entrypoints.serve_record import RecordSink
from ascent.messages import Generation
from ascent.rollout.server.chat import split_tool_calls
from ascent.rollout.server.errors import APIError, field_path
from ascent.rollout.server.ipc import generation_from_wire, generation_to_wire
from ascent.rollout.server.prepare import Limits, token_budget
from ascent.rollout.server.recorder import CompletionRecord, Recorder
from ascent.rollout.server.streaming import TextStream
from ascent.rollout.server.tool_parsers import hermes
from ascent.tracking.experience_store import open_store

BYTES = "héllo wörld".encode()


def byte_decode(ids: list[int]) -> str:
    """Token i is byte i of BYTES: multi-byte characters span two tokens."""
    return bytes(BYTES[i] for i in ids).decode(errors="replace")


def test_text_stream_never_splits_a_character_and_holds_back_stop_prefixes() -> None:
    stream = TextStream(byte_decode, ["wör"])
    deltas = [stream.push(i) for i in range(len(BYTES))]
    assert "".join(deltas) + stream.finish() == "héllo " and stream.stopped
    assert all("\ufffd" not in d for d in deltas)
    plain = TextStream(byte_decode, [])
    assert "".join(plain.push(i) for i in range(len(BYTES))) + plain.finish() == "héllo wörld"


def test_field_path_reads_like_openai() -> None:
    assert (
        field_path(("body", "messages", 0, "content", "list[TextPart]", 1, "text"))
        == "messages[0].content[1].text"
    )
    assert field_path(("body", "temperature")) == "temperature"
    assert field_path(("body",)) is None


def test_token_budget_fits_the_context() -> None:
    limits = Limits(max_model_len=100, vocab_size=10, default_max_tokens=30)
    assert token_budget(50, None, limits, "messages") == 30
    assert token_budget(90, None, limits, "messages") == 10
    assert token_budget(50, 50, limits, "messages") == 50
    with pytest.raises(APIError, match="maximum context length is 100 tokens") as err:
        token_budget(50, 51, limits, "messages")
    assert err.value.param == "max_tokens" and err.value.code == "context_length_exceeded"
    with pytest.raises(APIError) as err:
        token_budget(100, None, limits, "prompt")
    assert err.value.param == "prompt"


def test_tool_calls_parse_only_when_every_block_is_valid() -> None:
    content, calls = split_tool_calls(
        'ok <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>', hermes
    ) or (
        "",
        [],
    )
    assert content == "ok" and calls[0]["function"] == {"name": "f", "arguments": '{"x": 1}'}
    broken = 'a <tool_call>{"name": "f"}</tool_call> <tool_call>{nope</tool_call>'
    assert split_tool_calls(broken, hermes) is None


def _record(session: str, i: int) -> CompletionRecord:
    return CompletionRecord(session, f"c{i}", 0, "chat", [1], [2, 3], [-0.1, -0.2], "stop", 0)


def test_recorder_drains_per_session_and_stays_bounded() -> None:
    recorder = Recorder(max_records=3)
    for i, session in enumerate(["a", "b", "a", "b"]):
        recorder.record(_record(session, i))
    assert len(recorder) == 3 and recorder.dropped == 1
    assert [r.completion_id for r in recorder.drain("a")] == ["c2"]
    assert [r.completion_id for r in recorder.drain("b")] == ["c1", "c3"]
    assert recorder.sessions() == [] and len(recorder) == 0


def test_recorder_sink_sees_every_record_and_cannot_fail_one() -> None:
    seen: list[str] = []

    def sink(record: CompletionRecord) -> None:
        seen.append(record.completion_id)
        if record.completion_id == "c1":
            raise OSError("disk full")

    recorder = Recorder(max_records=1, sink=sink)
    for i in range(3):
        recorder.record(_record("a", i))
    assert seen == ["c0", "c1", "c2"]  # dropped from memory or not, the sink had them all
    assert [r.completion_id for r in recorder.drain("a")] == ["c2"]


def test_forced_flags_reach_the_record_its_store_and_the_front_end_wire(tmp_path: Path) -> None:
    """A record's tokens a grammar forced get loss mask 0 (a record without flags: none was forced), in
    `ascent serve --record`'s store too; a generation keeps its flags across the front ends' wire."""
    forced = replace(_record("a", 0), forced=[True, False])
    assert forced.loss_mask() == [0, 1] and _record("a", 1).loss_mask() == [1, 1]
    sink = RecordSink(str(tmp_path), str(tmp_path), lambda ids: "x" * len(ids))
    sink(forced)
    sink(_record("a", 1))
    sink.close()
    with open_store(tmp_path) as store:
        assert sorted(r.loss_mask for r in store.episodes()) == [[0, 1], [1, 1]]
    gen = Generation([2, 3], [-0.1, -0.2], "stop", [4, 4], 1, forced=[True, False])
    assert generation_from_wire(generation_to_wire(gen)) == gen


def test_serve_access_rules() -> None:
    assert check_access("0.0.0.0", "k", False) == "k"
    assert check_access("127.0.0.1", None, True) is None
    with pytest.raises(ServeError, match="loopback"):
        check_access("0.0.0.0", None, True)
    with pytest.raises(ServeError, match="--api-key is not set"):
        check_access("127.0.0.1", None, False)
    with pytest.raises(ServeError, match="choose one"):
        check_access("127.0.0.1", "k", True)


def test_api_processes_option(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_api_processes("auto") is None and parse_api_processes("3") == 3
    for bad in ["0", "-1", "two"]:
        with pytest.raises(ServeError, match=f"--api-processes {bad}: use a number"):
            parse_api_processes(bad)
    for cpus, expected in [(32, 8), (6, 3), (1, 1)]:
        monkeypatch.setattr(serve_module.os, "sched_getaffinity", lambda _, n=cpus: set(range(n)))
        assert auto_api_processes("cuda") == expected and auto_api_processes("cpu") == 1
