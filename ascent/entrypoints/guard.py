"""The command-line edge shared by `ascent.cli` and the sub-commands of `ascent.entrypoints`: the error guard
(user errors -> `error: ...` and exit 2, Ctrl-C -> 130, anything else a traceback and exit 1) and config
loading for a command. It sits below both, so a sub-command module never imports `ascent.cli` (which imports
the sub-commands). Fast: no torch.
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from types import TracebackType
from typing import Literal, TypeVar

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.text import Text

from ascent.config import ConfigError, RunConfig, SFTConfig, load_config
from ascent.errors import AscentError

M = TypeVar("M", bound=BaseModel)
USER_ERROR_NAMES = {"AscentError", "ConfigError", "DataError"}  # caught by name too: no heavy imports


class ServeError(AscentError):
    """A serve option the user can fix (`ascent serve`; here so `serve_record` need not import `serve`)."""


# ---------------------------------------------------------------- error handling


def _stderr() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def is_user_error(exc: BaseException) -> bool:
    """AscentError subclasses, and by class name the few user errors of packages we do not import here."""
    return isinstance(exc, AscentError) or any(c.__name__ in USER_ERROR_NAMES for c in type(exc).__mro__)


def debug_enabled() -> bool:
    return os.environ.get("ASCENT_DEBUG", "") not in ("", "0")


def print_error(exc: BaseException, label: str = "error: ") -> None:
    """`error: <message>` on stderr; a ConfigError's problems get one `error:` line each."""
    console = _stderr()
    if debug_enabled():
        console.print(Text("".join(traceback.format_exception(exc)).rstrip()))
    problems = exc.problems if isinstance(exc, ConfigError) else [str(exc) or type(exc).__name__]
    for problem in problems:
        console.print(Text(label, style="bold red") + Text(problem))


def environment_error(exc: BaseException) -> str | None:
    """A one-line message for the machine's errors a user fixes (a file's OSError, out of memory), else
    None."""
    if type(exc).__name__ == "OutOfMemoryError":
        return (
            f"out of memory ({str(exc).splitlines()[0] if str(exc) else 'no details'}). Lower "
            "train.max_tokens_per_micro_batch or train.logprob_chunk_tokens, set "
            "model.gradient_checkpointing=true, or lower rollout.gpu_memory_fraction."
        )
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.strerror or exc}: {exc.filename} (add --debug for the traceback)"
    return None


class ErrorGuard:
    """Wraps a command body: user errors -> exit 2, Ctrl-C -> exit 130, anything else propagates (exit 1).

    Set `run_dir` once known so an interrupted run can say where its last checkpoint is.
    """

    def __init__(self, resumable: bool = False) -> None:
        self.resumable = resumable
        self.run_dir: str | None = None

    def __enter__(self) -> ErrorGuard:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if exc is None:
            return False
        if isinstance(exc, KeyboardInterrupt):  # Ctrl-C, or a signal that could not wait for a safe point
            _stderr().print(Text("interrupted. ", style="bold yellow") + Text(self._resume_hint()))
            raise typer.Exit(128 + getattr(exc, "signum", 2))
        if type(exc).__name__ == "Interrupted":  # stopped at a safe point after SIGTERM/SIGINT
            print_error(exc, label="interrupted: ")
            raise typer.Exit(getattr(exc, "exit_code", 130))
        if is_user_error(exc):
            print_error(exc)
            raise typer.Exit(getattr(exc, "exit_code", 2) or 2)
        message = environment_error(exc)
        if message is not None:
            print_error(AscentError(message))
            raise typer.Exit(2)
        return False

    def _resume_hint(self) -> str:
        """Only what is true: the newest checkpoint that exists, or that none does."""
        if not (self.resumable and self.run_dir):
            return ""
        ckpts = Path(self.run_dir) / "checkpoints"
        done = sorted(p.name for p in ckpts.glob("iter_*") if (p / "state.json").is_file())
        if not done:
            return f"No checkpoint of this run exists yet under {self.run_dir}; a new run starts over."
        return (
            f"The newest checkpoint is {ckpts / done[-1]}; run the same command with --resume to continue "
            "from it."
        )


# ---------------------------------------------------------------- config loading


def load_for_command(
    config: str | None, overrides: list[str] | None, schema: type[M], resume: bool = False
) -> M:
    """Load `config` + `overrides`; a first argument that is `key=value` (not a file) counts as an
    override."""
    extra = list(overrides or [])
    if config is not None and "=" in config and not Path(config).exists():
        extra = [config, *extra]
        config = None
    if resume:
        extra.append("resume=true")
    return load_config(config, extra, schema)


def require_model_path(cfg: RunConfig | SFTConfig) -> None:
    if not cfg.model.path:
        raise ConfigError(
            "model.path is not set; point it at a local Hugging Face checkpoint directory, "
            "e.g. model.path=models/Qwen2.5-0.5B-Instruct."
        )


def sft_hint(config: str | None, overrides: list[str] | None, err: ConfigError) -> ConfigError:
    """Add `--sft` to the message when the failing run config is a valid SFT config that the run schema
    refused for its SFT-only keys (`epochs`, `batch_size`, ...), not for a rule only RL runs have."""
    sft_only = set(SFTConfig.model_fields) - set(RunConfig.model_fields)
    if not any(f"'{key}'" in problem for problem in err.problems for key in sft_only):
        return err
    try:
        load_for_command(config, overrides, SFTConfig)
    except AscentError:
        return err
    return ConfigError([*err.problems, "This is a valid SFT config: add --sft to show it as one."])
