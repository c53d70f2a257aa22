"""`ascent sft` on a file written for the OpenAI API (assistant `tool_calls`, `tool` results) trains; a
malformed call exits 2 naming the row, the field and the fix."""

from __future__ import annotations

import json
import shutil

from conftest import ascent_here, write_yaml

from tests.unit.chat_templates import QWEN25_TEMPLATE


def _row(a: int, b: int, name: str = "add") -> dict:
    call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": json.dumps({"a": a})}}
    return {
        "messages": [
            {"role": "user", "content": f"{a}+{b}?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": str(a + b)},
            {"role": "assistant", "content": str(a + b)},
        ]
    }


def test_sft_on_openai_tool_calls(tmp_path, tiny_model):
    model = shutil.copytree(tiny_model, tmp_path / "model")
    (model / "chat_template.jinja").write_text(QWEN25_TEMPLATE)  # Qwen2.5's: it renders tool calls
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(_row(a, 9 - a)) + "\n" for a in range(8)))
    cfg = {
        "run_dir": str(tmp_path / "sft"),
        "epochs": 1.0,
        "batch_size": 4,
        "model": {"path": str(model)},
        "data": {"train_path": str(data), "max_prompt_tokens": 64},
        "train": {"lr": 1e-3, "max_tokens_per_micro_batch": 256},
        "tracking": {"progress": False},
    }
    ascent_here("sft", str(write_yaml(tmp_path / "sft.yaml", cfg)))
    lines = [json.loads(x) for x in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "sft/nll" in x] == [1, 2]

    data.write_text(json.dumps(_row(1, 2)) + "\n" + json.dumps(_row(2, 3, name="")) + "\n")
    cfg["run_dir"] = str(tmp_path / "bad")
    proc = ascent_here("sft", str(write_yaml(tmp_path / "bad.yaml", cfg)), check=False)
    assert proc.returncode == 2
    assert "row 2: field 'messages' message 1: tool_calls[0].function.name is ''" in proc.stdout + proc.stderr
