"""Cheap integrity checks of checkpoint files, read before anything large is loaded (design: "models/").

A truncated or half-copied weight file otherwise fails deep inside `from_pretrained` or `torch.load` with a
message that names neither the file nor the fix. These read only headers and sizes: milliseconds even for
a 7B checkpoint. Used by the model loader, the pre-flight checks and `--resume`'s checkpoint verification.
`copy_processor_files` carries a vision-language checkpoint's image processor into the trainer's saves.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path


def safetensors_problem(f: Path) -> str | None:
    """None when the safetensors file `f` is whole, else what is wrong (truncated, bad header)."""
    size = f.stat().st_size
    if size < 8:
        return f"truncated ({size} bytes; a safetensors file starts with an 8-byte header length)"
    with open(f, "rb") as fh:
        (header_len,) = struct.unpack("<Q", fh.read(8))
        if header_len > size - 8:
            return f"truncated ({size} bytes, its header alone needs {header_len + 8})"
        try:
            header = json.loads(fh.read(header_len))
            ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
        except (ValueError, KeyError, TypeError, IndexError):
            return "not a valid safetensors file (its header is not valid JSON)"
    need = 8 + header_len + max(ends, default=0)
    return None if size >= need else f"truncated ({size} of {need} bytes)"


def damaged_weight_file(directory: Path) -> tuple[Path, str] | None:
    """The first damaged *.safetensors file of a checkpoint directory and its problem, or None."""
    for file in sorted(directory.glob("*.safetensors")):
        problem = safetensors_problem(file)
        if problem:
            return file, problem
    return None


PROCESSOR_FILES = ("preprocessor_config.json",)  # the image processor of a vision-language checkpoint


def copy_processor_files(source: str | Path, out: Path) -> list[str]:
    """Copy the image processor's files of checkpoint `source` (if it has them) into `out`, so that a saved
    vision-language checkpoint encodes images as the one it came from did. -> the names copied."""
    copied = []
    for name in PROCESSOR_FILES:
        src = Path(source) / name
        if src.is_file():
            shutil.copyfile(src, out / name)
            copied.append(name)
    return copied
