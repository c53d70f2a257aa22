"""Tests for ascent.models.loading: device/dtype names, checkpoint errors, pad-token fallback."""

from __future__ import annotations

import dataclasses
import inspect
import json
import types
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from ascent.models import load_model, load_tokenizer, make_tiny_checkpoint, resolve_device, torch_dtype
from ascent.models.families import FAMILIES
from ascent.models.loading import cache_kwarg


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


def _edit_tokenizer_config(path: Path, **changes: object) -> None:
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(changes)
    cfg_path.write_text(json.dumps(cfg))


def test_resolve_device_names() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    with pytest.raises(ValueError, match="device='tpu'"):
        resolve_device("tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_resolve_device_cuda_without_gpu_names_the_fix() -> None:
    with pytest.raises(ValueError, match="cluster.device=cpu"):
        resolve_device("cuda")


def test_torch_dtype_mapping_and_error() -> None:
    assert torch_dtype("bf16") is torch.bfloat16
    assert torch_dtype("fp16") is torch.float16
    assert torch_dtype("fp32") is torch.float32
    assert torch_dtype(torch.float16) is torch.float16
    with pytest.raises(ValueError, match=r"model.dtype='float8'.*bf16"):
        torch_dtype("float8")


@pytest.mark.parametrize(("name", "dtype"), [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_load_model_dtype_and_device(tiny_dir: Path, name: str, dtype: torch.dtype) -> None:
    model = load_model(tiny_dir, dtype=name, device="cpu")
    params = list(model.parameters())
    assert {p.dtype for p in params} == {dtype}
    assert {p.device.type for p in params} == {"cpu"}
    assert model.config._attn_implementation == "sdpa"
    assert not model.training


def test_load_model_takes_the_class_of_the_checkpoints_family(tiny_dir: Path, monkeypatch) -> None:
    bare = dataclasses.replace(FAMILIES["qwen2"], trainer_class="AutoModel")
    monkeypatch.setitem(FAMILIES, "qwen2", bare)
    model = load_model(tiny_dir, device="cpu")
    assert not hasattr(model, "lm_head") and hasattr(model, "layers")  # the family's class: a bare decoder


def _checkpointing_on(model: torch.nn.Module) -> bool:
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def test_load_model_gradient_checkpointing(tiny_dir: Path) -> None:
    assert not _checkpointing_on(load_model(tiny_dir, device="cpu"))
    assert _checkpointing_on(load_model(tiny_dir, device="cpu", gradient_checkpointing=True))


def test_load_model_missing_dir_names_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ValueError, match=r"nope.*no such directory.*local directories"):
        load_model(missing, device="cpu")


def test_a_missing_tokenizer_directory_names_the_setting_that_named_it(tmp_path: Path) -> None:
    from ascent.models.loading import load_tokenizer

    missing = str(tmp_path / "tok")
    with pytest.raises(
        ValueError, match=r"^model.tokenizer_path='.*tok': no such directory.*tokenizer files"
    ):
        load_tokenizer(missing, field="model.tokenizer_path")
    with pytest.raises(ValueError, match=r"^model.path='.*tok': no such directory"):
        load_tokenizer(missing)


def test_a_file_given_as_the_model_directory_is_called_a_file(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=r"model.safetensors': a file, not a directory; point model.path at"):
        load_tokenizer(tmp_path / "model.safetensors")


def test_a_tokenizer_without_its_vocabulary_is_refused(tmp_path: Path) -> None:
    # tokenizer_config.json alone loads as a tokenizer that encodes every prompt to no tokens: the run
    # trained on empty prompts
    path = make_tiny_checkpoint(tmp_path / "ckpt")
    (path / "tokenizer.json").unlink()
    with pytest.raises(
        ValueError, match=r"^model.path='.*ckpt': the tokenizer has no vocabulary \(it encodes"
    ):
        load_tokenizer(path)


def test_load_model_dir_without_config(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="no config.json"):
        load_model(tmp_path, device="cpu")


def test_load_tokenizer_keeps_existing_pad(tiny_dir: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tok = load_tokenizer(tiny_dir)
    assert tok.pad_token == "<|pad|>"
    assert tok.pad_token_id == 0


def test_load_tokenizer_pad_falls_back_to_eos_with_warning(tmp_path: Path) -> None:
    path = make_tiny_checkpoint(tmp_path / "ckpt")
    _edit_tokenizer_config(path, pad_token=None)
    with pytest.warns(UserWarning, match="no pad token; using its EOS token"):
        tok = load_tokenizer(path)
    assert tok.pad_token == tok.eos_token == "<|im_end|>"
    assert tok.pad_token_id == tok.eos_token_id == 1


def test_load_tokenizer_without_pad_or_eos_errors(tmp_path: Path) -> None:
    path = make_tiny_checkpoint(tmp_path / "ckpt")
    _edit_tokenizer_config(path, pad_token=None, eos_token=None)
    with pytest.raises(ValueError, match="neither a pad token nor an EOS token"):
        load_tokenizer(path)


def test_cache_kwarg_follows_the_forward_signature_through_wrappers(tiny_dir: Path) -> None:
    class OldStyle(torch.nn.Module):  # transformers 5.17's causal LMs
        def forward(self, input_ids: Any = None, past_key_values: Any = None, **kwargs: Any) -> None: ...

    class NewStyle(torch.nn.Module):  # transformers >= 5.2x
        def forward(self, input_ids: Any = None, cache: Any = None, **kwargs: Any) -> None: ...

    class Wrapper(torch.nn.Module):  # PEFT's forward only passes **kwargs on
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def get_base_model(self) -> torch.nn.Module:
            return self.inner

        def forward(self, *args: Any, **kwargs: Any) -> None: ...

    assert cache_kwarg(OldStyle()) == "past_key_values"
    assert cache_kwarg(NewStyle()) == "cache"
    assert cache_kwarg(Wrapper(NewStyle())) == "cache"
    compiled = types.SimpleNamespace(
        _orig_mod=OldStyle(), forward=lambda *a, **k: None
    )  # torch.compile's shape
    assert cache_kwarg(compiled) == "past_key_values"
    model = load_model(tiny_dir, device="cpu")
    assert cache_kwarg(model) in inspect.signature(type(model).forward).parameters
