"""Errors that say the fix for the failures other VL stacks' guides spend pages on: an image processor or a
tokenizer that does not belong to the model, bf16 on a GPU without it, and relative image paths that do not
resolve. All on the CPU, in milliseconds: the processor files without weights (`tests/unit/vl_files.py`) and
a monkeypatched CUDA capability."""

from __future__ import annotations

import json
import logging
import pickle
import shutil

import pytest
import torch

from ascent.data import DataError, image_codec
from ascent.errors import AscentError
from ascent.models import loading
from ascent.models.content import ImageLoadError, ImageRef, ResolvedPath, image_bytes, resolve_paths
from ascent.models.loading import ModelLoadError, auto_dtype, check_dtype_supported, compute_dtype
from ascent.models.tiny import make_char_tokenizer
from ascent.models.vision import ImageCodecError, load_image_codec, tokenizer_problem


@pytest.fixture
def vl_dir(vl_processor_dir, tmp_path):
    """A copy of the VL processor files whose config.json describes its vision tower (patch 14, merge 2)."""
    out = tmp_path / "vl"
    shutil.copytree(vl_processor_dir, out)
    config = json.loads((out / "config.json").read_text())
    config["vision_config"] = {"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_a_processor_cut_for_another_vision_tower_is_refused(vl_dir):
    assert load_image_codec(vl_dir).merge_size == 2  # matching files load
    processor = json.loads((vl_dir / "preprocessor_config.json").read_text())
    (vl_dir / "preprocessor_config.json").write_text(json.dumps({**processor, "patch_size": 16}))
    with pytest.raises(ImageCodecError) as err:
        load_image_codec(vl_dir)
    text = str(err.value)
    assert "preprocessor_config.json has patch_size=16" in text and "takes patch_size=14" in text
    assert "Copy preprocessor_config.json from the checkpoint" in text and err.value.exit_code == 2
    (vl_dir / "preprocessor_config.json").write_text(json.dumps({**processor, "merge_size": 4}))
    with pytest.raises(
        ImageCodecError, match="merge_size=4, but the vision tower takes spatial_merge_size=2"
    ):
        load_image_codec(vl_dir)


def test_a_text_tokenizer_for_a_vision_language_model_is_refused(vl_dir, tmp_path):
    from transformers import AutoTokenizer

    own = AutoTokenizer.from_pretrained(str(vl_dir))
    codec = image_codec(str(vl_dir), tokenizer=own)  # its own tokenizer writes its image token
    assert codec is not None and tokenizer_problem(own, codec.image_token_id) is None
    text = make_char_tokenizer(tmp_path / "text")  # no vision tokens: id image_token_id is a character
    problem = tokenizer_problem(text, codec.image_token_id)
    assert problem is not None and f"image_token_id={codec.image_token_id} is " in problem
    with pytest.raises(DataError) as err:
        image_codec(str(vl_dir), tokenizer=text, tokenizer_field="model.tokenizer_path")
    msg = str(err.value)
    assert msg.startswith("model.tokenizer_path=") and "unset model.tokenizer_path" in msg
    assert isinstance(err.value, AscentError) and err.value.exit_code == 2


def _fake_v100(monkeypatch) -> None:
    """A GPU where torch's default check says yes (bf16 is emulated) but there is no native bf16."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-32GB")


def test_bf16_on_a_gpu_without_it_is_refused_with_the_flag_to_set(monkeypatch):
    _fake_v100(monkeypatch)
    cuda = torch.device("cuda", 0)
    with pytest.raises(ModelLoadError) as err:
        compute_dtype("bf16", cuda)
    assert "model.dtype=bf16" in str(err.value) and "'Tesla V100-SXM2-32GB'" in str(err.value)
    assert "set model.dtype=fp16 (or fp32)" in str(err.value) and err.value.exit_code == 2
    with pytest.raises(ModelLoadError, match="set reward.model.dtype=fp16"):
        check_dtype_supported(torch.bfloat16, cuda, "reward.model.dtype")
    assert compute_dtype("fp16", cuda) == torch.float16  # what the message says works
    assert compute_dtype("bf16", torch.device("cpu")) == torch.bfloat16  # the CPU runs bf16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert compute_dtype("bf16", cuda) == torch.bfloat16  # an Ampere-or-newer GPU


def test_serve_dtype_auto_falls_back_to_fp16_saying_so(monkeypatch, caplog):
    _fake_v100(monkeypatch)
    with caplog.at_level(logging.WARNING, logger=loading.logger.name):
        assert auto_dtype(torch.device("cuda", 0)) == "fp16"
    assert "no native bf16; using fp16" in caplog.text
    assert auto_dtype(torch.device("cpu")) == "fp32"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert auto_dtype(torch.device("cuda", 0)) == "bf16"


def test_a_relative_image_path_that_does_not_resolve_names_both_paths_and_the_folder(tmp_path):
    row = {
        "prompt": [{"role": "user", "content": [{"type": "image", "image": "imgs/gone.png"}]}],
        "images": ["elsewhere/x.png"],
    }
    resolve_paths(row, tmp_path)
    path = row["prompt"][0]["content"][0]["image"]
    assert isinstance(path, ResolvedPath) and path == str(tmp_path / "imgs" / "gone.png")
    copy = pickle.loads(pickle.dumps(path))  # rows travel to workers
    assert copy == path and (copy.written, copy.folder) == ("imgs/gone.png", str(tmp_path))
    with pytest.raises(ImageLoadError) as err:
        image_bytes(ImageRef(path, str(path)))
    assert err.value.why == (
        f"no such file (the row writes 'imgs/gone.png', resolved against the dataset file's folder {tmp_path}); "
        "give an absolute path or a path relative to that folder"
    )
    assert row["images"][0].written == "elsewhere/x.png"
    gone = str(tmp_path / "abs.png")
    with pytest.raises(ImageLoadError, match="no such file; give an existing absolute path"):
        image_bytes(ImageRef(gone, gone))
