"""What `--resume` checks before it continues a run: the checkpoint is whole, and the run is the same run.

- `verify_checkpoint` reads the cheap parts of every file of a checkpoint (state.json, the safetensors
  headers against the file sizes, the zip directory of each torch file) and names the first damaged file.
- `pick_checkpoint` takes the newest checkpoint (or the one `--resume-from` names); a damaged one is refused
  with the file named and the previous complete checkpoint offered.
- `config_changes` compares the checkpoint's saved config with the new one. Changes that break an exact
  continuation (model, data, seed, batch sizes, algorithm, optimizer) are refused with every field named,
  unless the user passes `--accept-changes`; harmless ones (iterations, logging, timeouts) pass.
- `fingerprint` identifies the model and data files, so swapping a model of the same shape under the same
  path is noticed too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import zipfile
from pathlib import Path
from typing import Any

from ascent.config.choices import CHOICE_FIELDS, PluginChoice, name_of
from ascent.config.nesting import nest_choices
from ascent.config.sources import SOURCE_CHOICES, nest_legacy
from ascent.errors import AscentError
from ascent.models.files import safetensors_problem
from ascent.trainer.checkpoint_commit import damaged_text

log = logging.getLogger("ascent")

# Fields whose change keeps a resumed run an exact continuation (dotted prefixes). Everything else counts.
HARMLESS = (
    "iterations",
    "resume",
    "run_dir",
    "val_every",
    "data.val_path",
    "data.max_val_prompts",
    "rollout.val_temperature",
    "rollout.val_samples_per_prompt",
    "checkpoint.",
    "tracking.",
    "cluster.worker_timeout_s",
    "cluster.address",
    # ranks sum their gradients, and sharded checkpoints load on any number of ranks (torch DCP)
    "cluster.num_trainer_workers",
    "train.sequence_parallel",  # the same loss and gradients however the rows are split (no state of its own)
    "reward.timeout_s",
    "reward.num_workers",
    "reward.memory_limit_mb",
    "reward.isolation",
    "reward.max_failure_rate",
    "epochs",  # SFT: the schedule was fixed at the start, more epochs only extend the data pass
)
STATE_KEYS = ("config", "sampler")  # besides "iteration": what every run's state.json holds, as objects
SAMPLE = 1 << 20  # bytes hashed at each end of a file for its fingerprint


class ResumeError(AscentError):
    """The checkpoint cannot be resumed as asked; the message names the file or the fields and the fix."""


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}: leaves of a nested config dict by dotted path."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in ("kwargs", "options"):
            out |= flatten(value, path + ".")
        else:
            out[path] = value
    return out


def config_changes(
    saved: dict[str, Any], new: dict[str, Any], defaults: dict[str, Any] | None = None
) -> list[str]:
    """`field: old -> new` for every field that differs and is not harmless, sorted by field.

    A field the saved config lacks (added to the schema since the checkpoint) counts as unchanged while the
    new config holds its value in `defaults`: the old run behaved as that default. A choice whose name
    changed (`algorithm.advantage.name`) is one change, not one per setting of either member."""
    saved = _nested_choices(saved)
    old_flat, new_flat = flatten(saved), flatten(_nested_choices(new))
    default_flat = flatten(_source_defaults(saved, _choice_defaults(saved, defaults or {})))
    changed: dict[str, str] = {}
    for key in sorted(set(old_flat) | set(new_flat)):
        if key.startswith(HARMLESS) or key in HARMLESS:
            continue
        if key not in old_flat and key in default_flat and new_flat.get(key) == default_flat[key]:
            continue
        before, after = old_flat.get(key, "(absent)"), new_flat.get(key, "(absent)")
        if before != after:
            changed[key] = f"{key}: {before!r} -> {after!r}"
    renamed = {key.removesuffix("name") for key in changed if key.endswith(".name")}
    return [
        text for key, text in changed.items() if key.endswith(".name") or not key.startswith(tuple(renamed))
    ]


def _nested_choices(saved: dict[str, Any]) -> dict[str, Any]:
    """A config saved before the policy loss and the advantage became choices (`policy_loss: ppo` beside a
    flat `clip_ratio_low`), or before the episode source did (`rollout.env`, `rollout.max_turns`, ...), in
    today's form; the settings its choice did not read are dropped."""
    algorithm, rollout = saved.get("algorithm"), saved.get("rollout")
    if isinstance(rollout, dict):
        saved = saved | {"rollout": nest_legacy(rollout)[0]}
    if not isinstance(algorithm, dict):
        return saved
    return saved | {"algorithm": nest_choices(algorithm, strict=False).data}


def _source_defaults(saved: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """`defaults` with the episode source's defaults taken from the member the saved config chose: a setting
    added to the env source since the checkpoint (`sims_per_worker`) defaults to its value there."""
    source = (saved.get("rollout") or {}).get("source")
    member = SOURCE_CHOICES.get(str(source.get("name"))) if isinstance(source, dict) else None
    if member is None:
        return defaults
    own = {
        k: f.get_default(call_default_factory=True)
        for k, f in member.model_fields.items()
        if not f.is_required()
    }
    return defaults | {"rollout": dict(defaults.get("rollout") or {}) | {"source": own}}


def _choice_defaults(saved: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """`defaults` with each choice's defaults taken from the member the saved config chose: a setting an old
    sapo checkpoint lacks defaults to SapoLoss's value, not to the default member's (ppo has none)."""

    algorithm, default_algorithm = saved.get("algorithm"), defaults.get("algorithm")
    if not isinstance(algorithm, dict) or not isinstance(default_algorithm, dict):
        return defaults
    own = dict(default_algorithm)
    for field, (choices, _) in CHOICE_FIELDS.items():
        name = name_of(algorithm.get(field))
        if isinstance(name, str) and (name in choices or ":" in name):
            member = choices.get(name, PluginChoice)
            own[field] = member.model_validate({"name": name}).model_dump(mode="json")
    return defaults | {"algorithm": own}


def check_same_run(
    state: dict[str, Any],
    cfg_dict: dict[str, Any],
    accept: bool,
    where: Path,
    defaults: dict[str, Any] | None = None,
) -> None:
    """Refuse a resume whose config or input files differ from the checkpoint's, unless `accept`
    (`defaults`: the schema's defaults, for fields newer than the checkpoint)."""
    changes = config_changes(state.get("config") or {}, cfg_dict, defaults)
    saved_prints = state.get("fingerprints") or {}
    for name, value in fingerprints(cfg_dict).items():
        if name in saved_prints and saved_prints[name] != value:
            changes.append(f"{name}: the files changed since the checkpoint (same path, other contents)")
    if not changes:
        return
    listing = "; ".join(changes)
    if accept:
        log.warning("resuming %s with changed settings (--accept-changes): %s", where, listing)
        return
    raise ResumeError(
        f"--resume: the run in {str(where)!r} was started with other settings, so it would not continue "
        f"exactly: {listing}. Resume with the settings it was started with (the run_dir's config.yaml), or "
        "pass --accept-changes to continue with the new ones."
    )


def checkpoint_kind(state: dict[str, Any]) -> str | None:
    """ "RL" (`ascent train`) or "SFT" (`ascent sft`): which command wrote a checkpoint's `state`, told by the
    fields of its saved config; None when neither's show."""
    config = state.get("config") or {}
    if "algorithm" in config:
        return "RL"
    return "SFT" if "epochs" in config else None


def check_kind(state: dict[str, Any], kind: str, where: Path) -> None:
    """Refuse to resume an SFT checkpoint in an RL run (`kind` "RL") or the reverse: the other command's
    weights are a starting point (`model.path`), not a run to continue."""
    saved = checkpoint_kind(state)
    if saved is None or saved == kind:
        return
    command = {"RL": "ascent train", "SFT": "ascent sft"}
    starts = [f"{where.parent.parent / 'final'} (the SFT run's final weights)"] if saved == "SFT" else []
    if (where / "config.json").is_file():  # the checkpoint's own HF weights load as a model too
        starts.append(f"{where} (this checkpoint's weights)")
    start = " or ".join(f"model.path={s}" for s in starts) or "model.path to its run's exported weights"
    raise ResumeError(
        f"--resume: {str(where)!r} is an {saved} checkpoint ({command[saved]}), and {command[kind]} resumes "
        f"only its own {kind} checkpoints. To start {kind} from its weights, set {start} and start a new run "
        "(without --resume or --resume-from)."
    )


def check_iterations(done: int, total: int, what: str, where: Path) -> None:
    """Refuse to resume a checkpoint at `done` when the run now asks for `total` < done (`what` names it)."""
    if total < done:
        raise ResumeError(
            f"{what}: the checkpoint {where.name} is already at {done} of them; set it to {done} or more "
            "(it is the run's total, not the number still to run), or start a new run_dir."
        )


# ---------------------------------------------------------------- fingerprints


def fingerprint(path: str | Path) -> str:
    """A cheap identity of a file or of a checkpoint directory's weight/config files: sizes + sampled
    bytes."""
    p = Path(path)
    files = [p] if p.is_file() else sorted(f for f in p.glob("*") if f.suffix in (".json", ".safetensors"))
    digest = hashlib.sha256()
    for f in files:
        if not f.is_file():
            continue
        size = f.stat().st_size
        digest.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            digest.update(fh.read(SAMPLE))
            if size > 2 * SAMPLE:
                fh.seek(size - SAMPLE)
                digest.update(fh.read(SAMPLE))
    return digest.hexdigest()[:16]


def fingerprints(cfg_dict: dict[str, Any]) -> dict[str, str]:
    """Fingerprints of model.path and data.train_path (those that exist) of a config dict."""
    found = {}
    for key, path in (
        ("model.path", cfg_dict["model"]["path"]),
        ("data.train_path", cfg_dict["data"]["train_path"]),
    ):
        if path and Path(path).exists():
            found[key] = fingerprint(path)
    return found


# ---------------------------------------------------------------- checkpoint integrity


def verify_checkpoint(path: Path, earlier: list[Path] | None = None) -> None:
    """Raise ResumeError naming the first damaged file of checkpoint `path` (cheap: headers and sizes).

    `earlier`: the complete checkpoints before it, oldest first; the error offers the newest of them.
    """
    earlier = earlier or []
    state_file = path / "state.json"
    try:
        state = json.loads(state_file.read_text())
        int(state["iteration"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise _damaged(path, state_file, f"unreadable ({type(err).__name__}: {err})", earlier) from None
    problem = _state_problem(state)
    if problem:
        raise _damaged(path, state_file, problem, earlier)
    for f in sorted(path.rglob("*")):
        if not f.is_file():
            continue
        problem = None
        if f.suffix == ".safetensors":
            problem = safetensors_problem(f)
        elif f.suffix in (".pt", ".bin"):
            problem = _zip_problem(f)
        elif f.suffix == ".json":
            problem = _json_problem(f)
        if problem:
            raise _damaged(path, f, problem, earlier)


def _state_problem(state: dict[str, Any]) -> str | None:
    """What a readable state.json lacks of `STATE_KEYS` (a write that was cut short or edited), or None."""
    missing = [repr(key) for key in STATE_KEYS if key not in state]
    garbled = [repr(key) for key in STATE_KEYS if key in state and not isinstance(state[key], dict)]
    if missing:
        return f"incomplete: it lacks {' and '.join(missing)}"
    if garbled:
        return f"garbled: {' and '.join(garbled)} should be an object"
    return None


def _zip_problem(f: Path) -> str | None:
    if f.stat().st_size == 0:
        return "empty (0 bytes)"
    try:
        with zipfile.ZipFile(f) as z:
            z.infolist()
    except (zipfile.BadZipFile, OSError) as err:
        return f"truncated or corrupt ({err})"
    return None


def _json_problem(f: Path) -> str | None:
    try:
        json.loads(f.read_text())
    except (OSError, ValueError) as err:
        return f"not valid JSON ({err})"
    return None


def _damaged(ckpt: Path, file: Path, problem: str, earlier: list[Path]) -> ResumeError:
    return ResumeError(damaged_text(ckpt, file.name, problem, earlier))


def pick_checkpoint(complete: list[Path], resume_from: str | None) -> Path | None:
    """The checkpoint to resume, verified: `resume_from` (a name like iter_000004 or a path) or the newest.

    `complete`: the run's complete checkpoints, oldest first (`checkpointing.checkpoint_dirs`).
    """
    if resume_from:
        path = Path(resume_from)
        if not path.is_dir():
            path = complete[0].parent / resume_from if complete else path
        if not (path / "state.json").is_file():
            names = ", ".join(p.name for p in complete) or "none"
            raise ResumeError(
                f"--resume-from {resume_from}: not a complete checkpoint (no state.json in {str(path)!r}); "
                f"the checkpoints of this run are: {names}."
            )
    elif not complete:
        return None
    else:
        path = complete[-1]
    verify_checkpoint(path, [p for p in complete if p.name < path.name])
    return path
