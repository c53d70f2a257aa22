"""Load Hugging Face causal LMs and tokenizers from local directories (design: "models/").

Every worker that holds weights (policy trainer, reference scorer, rollout engine) loads them here, so
device and dtype names, the pad-token fallback and the "checkpoint not found" errors behave the same
everywhere. Nothing here ever reaches a model hub: paths are local directories, loaded with
`local_files_only=True`. `transformers` is imported inside the functions to keep `import ascent.models`
cheap. Which classes load a checkpoint is its model family's choice (`ascent.models.families`); a
`model_type` without a family loads as a plain causal LM with an auto tokenizer.
"""

from __future__ import annotations

import inspect
import json
import logging
import warnings
from pathlib import Path
from typing import Any

import torch

from ascent.errors import AscentError
from ascent.models.families import CAUSAL_LM, FAMILIES, Family, resolve_class
from ascent.models.files import damaged_weight_file

logger = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEVICE_NAMES = ("auto", "cpu", "cuda")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
VOCABULARY_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model")  # the usual ones, for the error


class ModelLoadError(AscentError, ValueError):
    """A model, tokenizer, device or dtype setting the user can fix; the message names the field and fix."""


def resolve_device(name: str | torch.device = "auto") -> torch.device:
    """Turn `auto` | `cpu` | `cuda` (or `cuda:N`) into a torch.device; `auto` picks CUDA when present."""
    if isinstance(name, torch.device):
        return name
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ModelLoadError(
                f"device={name!r}: torch.cuda.is_available() is False on this machine; "
                "set cluster.device=cpu (or auto)."
            )
        return torch.device(name)
    raise ModelLoadError(
        f"device={name!r} is not a known device; use one of {list(DEVICE_NAMES)} (or cuda:N)."
    )


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    """Map `bf16` | `fp16` | `fp32` to the torch dtype (a torch.dtype passes through)."""
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ModelLoadError(f"model.dtype={name!r} is not a known dtype; use one of {sorted(DTYPES)}.")
    return DTYPES[name]


def bf16_supported() -> bool:
    """Whether this process's CUDA GPU runs bfloat16 natively (compute capability >= 8.0). torch's own
    default also counts emulation, which says yes on a V100 (7.0) where bf16 matmuls crawl or fail."""
    return bool(torch.cuda.is_bf16_supported(including_emulation=False))


def check_dtype_supported(dtype: torch.dtype, device: torch.device, field: str = "model.dtype") -> None:
    """Refuse bf16 on a CUDA GPU without native bf16 (pre-Ampere: V100, T4), naming `field` and fp16.

    Every component the user set a dtype for refuses rather than falls back (trainer, critic, reference
    model, both engines, reward model): the sampler and the trainer must compute in the same precision, and
    fp16 or fp32 changes memory and numerics, which is the user's choice to make. Only `ascent serve
    --dtype auto`, where ascent picked bf16, falls back to fp16 (`auto_dtype`)."""
    if dtype != torch.bfloat16 or device.type != "cuda" or bf16_supported():
        return
    try:
        gpu = repr(torch.cuda.get_device_name(device))
    except (RuntimeError, AssertionError, AttributeError):  # no CUDA runtime to ask (tests)
        gpu = "of this machine"
    raise ModelLoadError(
        f"{field}=bf16: the GPU {gpu} has no native bfloat16 support (compute capability < 8.0); set "
        f"{field}=fp16 (or fp32)."
    )


def compute_dtype(name: str | torch.dtype, device: torch.device, field: str = "model.dtype") -> torch.dtype:
    """`torch_dtype(name)`, refused where the device cannot compute in it (`check_dtype_supported`)."""
    dtype = torch_dtype(name)
    check_dtype_supported(dtype, device, field)
    return dtype


def auto_dtype(device: torch.device) -> str:
    """What `--dtype auto` means on `device`: bf16 on a GPU that has it, fp16 (said in a warning) on one
    that does not, fp32 on the CPU."""
    if device.type != "cuda":
        return "fp32"
    if bf16_supported():
        return "bf16"
    logger.warning(
        "--dtype auto: this GPU has no native bf16; using fp16 (set --dtype fp32 if outputs overflow)"
    )
    return "fp16"


def _check_checkpoint_dir(path: str | Path, what: str, field: str = "model.path") -> Path:
    """Return `path` as a Path, or raise naming the setting `field`, the path, what is missing and the fix."""
    p = Path(path).expanduser()
    if not str(path):
        raise ModelLoadError(f"{field} is empty: set {field}=<local directory of a Hugging Face {what}>.")
    holding = "the tokenizer files" if what == "tokenizer" else "config.json and the weights"
    if p.is_file():
        raise ModelLoadError(
            f"{field}={str(path)!r}: a file, not a directory; point {field} at the directory holding "
            f"{holding} (e.g. {str(p.parent)!r})."
        )
    if not p.is_dir():
        raise ModelLoadError(
            f"{field}={str(path)!r}: no such directory. ascent loads {what}s from local directories only "
            f"(no hub downloads); point {field} at a directory holding {holding} (e.g. one written by "
            "`huggingface-cli download` or `save_pretrained`)."
        )
    return p


def family_of_dir(path: Path) -> Family:
    """The family of the checkpoint in `path` by its config.json's model_type; CAUSAL_LM when it has none
    (no config.json, as a bare tokenizer directory, or a model_type no family covers)."""
    try:
        model_type = json.loads((path / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return CAUSAL_LM
    return FAMILIES.get(model_type, CAUSAL_LM)


def load_tokenizer(path: str | Path, trust_remote_code: bool = False, field: str = "model.path") -> Any:
    """Load the tokenizer in directory `path`; fall back to EOS as the pad token (with a warning). `field` is
    the setting that named `path` (`model.tokenizer_path` when it is set), for errors.

    Raises ValueError when the tokenizer defines neither a pad nor an EOS token.
    """
    p = _check_checkpoint_dir(path, "tokenizer", field)
    if not any((p / name).is_file() for name in TOKENIZER_FILES):
        raise ModelLoadError(
            f"{field}={str(path)!r} holds no tokenizer ({', '.join(TOKENIZER_FILES[:2])}, ...); "
            "point model.tokenizer_path (or model.path) at the directory `tokenizer.save_pretrained` wrote."
        )
    try:
        tokenizer = resolve_class(family_of_dir(p).tokenizer_class).from_pretrained(
            str(p), local_files_only=True, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ModelLoadError(
            f"{field}={str(path)!r}: the tokenizer does not load ({type(err).__name__}: {err}); "
            "check its tokenizer files (or copy them again from the original checkpoint)."
        ) from err
    _check_vocabulary(tokenizer, p, field)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelLoadError(
                f"tokenizer at {str(p)!r} has neither a pad token nor an EOS token; set `pad_token` (and "
                "`eos_token`) in its tokenizer_config.json."
            )
        message = (
            f"tokenizer at {str(p)!r} has no pad token; using its EOS token {tokenizer.eos_token!r} "
            "for padding. Set `pad_token` in tokenizer_config.json to silence this."
        )
        warnings.warn(message, stacklevel=2)
        logger.warning(message)
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _check_vocabulary(tokenizer: Any, path: Path, field: str) -> None:
    """Raise when the tokenizer encodes text to no tokens: its vocabulary file is missing (transformers
    builds an empty tokenizer from tokenizer_config.json alone, and every prompt would train as empty)."""
    if tokenizer.encode("Hello 1", add_special_tokens=False):
        return
    raise ModelLoadError(
        f"{field}={str(path)!r}: the tokenizer has no vocabulary (it encodes 'Hello 1' to no tokens); its "
        f"vocabulary file is missing (one of {', '.join(VOCABULARY_FILES)}). "
        "Copy the tokenizer files again from the original checkpoint."
    )


def _enable_activation_checkpointing(model: Any) -> None:
    """Recompute each decoder layer's activations in backward (non-reentrant torch checkpoint)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def load_model(
    path: str | Path,
    dtype: str | torch.dtype = "fp32",
    device: str | torch.device = "auto",
    gradient_checkpointing: bool = False,
    trust_remote_code: bool = False,
) -> Any:
    """Load the model in directory `path` (its family's trainer class; a causal LM unless the family says
    otherwise) with SDPA attention, in `dtype`, on `device` (eval mode)."""
    p = _check_checkpoint_dir(path, "checkpoint")
    if not (p / "config.json").is_file():
        raise ModelLoadError(
            f"model.path={str(path)!r} has no config.json, so it is not a Hugging Face checkpoint directory; "
            "point model.path at the directory that holds config.json and the *.safetensors weights."
        )
    dt, dev = torch_dtype(dtype), resolve_device(device)
    check_dtype_supported(dt, dev)
    damaged = damaged_weight_file(p)
    if damaged:
        raise ModelLoadError(
            f"model.path={str(path)!r}: {damaged[0].name} is {damaged[1]}; the weights are damaged (an "
            "interrupted copy or save?). Copy the checkpoint again."
        )
    try:
        model: Any = resolve_class(family_of_dir(p).trainer_class).from_pretrained(
            str(p),
            dtype=dt,
            local_files_only=True,
            attn_implementation="sdpa",
            trust_remote_code=trust_remote_code,
        )
    except (OSError, ValueError, KeyError) as err:
        raise ModelLoadError(
            f"model.path={str(path)!r}: the checkpoint does not load ({type(err).__name__}: {err}); check "
            "config.json and that the weight files are complete."
        ) from err
    model.to(dev)
    if gradient_checkpointing:
        _enable_activation_checkpointing(model)
    model.eval()
    return model


def cache_kwarg(model: Any) -> str:
    """The name `model.forward` takes its KV cache under: `cache` (transformers >= 5.2x, where
    `past_key_values` is deprecated, to be removed in 5.40) or `past_key_values` (5.17). A PEFT or
    `torch.compile` wrapper is looked through, since its own forward only passes `**kwargs` on."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = getattr(inner, "_orig_mod", inner)
    return "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"
