"""Doctor checks of the model directory without loading its weights: the config loads, the parameter count
and sizes (counted on the meta device), the tokenizer's pad/EOS and chat template, the fast engine's support
for the architecture (`ascent.rollout.fast.spec`), and which environments of the config render.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ascent.config.schema import RunConfig
from ascent.config.sources import EnvSourceConfig
from ascent.data import load_rows
from ascent.doctor.memory import ModelShape
from ascent.doctor.report import CheckResult, fail, ok, skipped, warn
from ascent.envs import ENVIRONMENTS, make_env
from ascent.models.families import CAUSAL_LM, FAMILIES, model_type_of, resolve_class
from ascent.models.families.qwen3_moe import moe_layers
from ascent.plugins import PluginError, load_plugin


def load_hf_config(cfg: RunConfig) -> Any:
    from transformers import AutoConfig  # deferred: transformers, slow to import

    return AutoConfig.from_pretrained(
        cfg.model.path, local_files_only=True, trust_remote_code=cfg.model.trust_remote_code
    )


def count_params(hf_config: Any) -> int:
    """Parameters of the model the config describes (with its family's model class: a vision-language
    model's vision tower counts), built on the meta device (no memory, no weights); a tied embedding counts
    once."""
    import torch  # deferred: torch; doctor imports without it

    family = FAMILIES.get(model_type_of(hf_config), CAUSAL_LM)
    with torch.device("meta"):
        model = resolve_class(family.trainer_class).from_config(hf_config)
    return sum(p.numel() for p in model.parameters())


def model_shape(hf_config: Any, params: int) -> ModelShape:
    text = getattr(hf_config, "get_text_config", lambda: hf_config)()
    heads = int(text.num_attention_heads)
    hidden = int(text.hidden_size)
    experts = int(getattr(text, "num_experts", None) or getattr(text, "num_local_experts", None) or 0)
    moe = dict(
        experts=experts,
        experts_per_token=int(getattr(text, "num_experts_per_tok", 0) or 0),
        expert_intermediate=int(getattr(text, "moe_intermediate_size", None) or 0),
        moe_layers=len(moe_layers(text)) if experts else 0,
    )
    return ModelShape(
        params=params,
        vocab=int(text.vocab_size),
        hidden=hidden,
        intermediate=int(getattr(text, "intermediate_size", None) or 4 * hidden),
        layers=int(text.num_hidden_layers),
        heads=heads,
        kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(text, "head_dim", None) or hidden // heads),
        tied=bool(getattr(hf_config, "tie_word_embeddings", False)),
        context=int(getattr(text, "max_position_embeddings", None) or 0),
        **moe,
    )


def check_model(cfg: RunConfig) -> tuple[CheckResult, ModelShape | None]:
    """The checkpoint's config loads and describes a causal LM; -> (result, its shape or None)."""
    name = "model"
    if not cfg.model.path:
        return fail(
            name, "model.path is not set", "point model.path at a local Hugging Face checkpoint."
        ), None
    path = Path(cfg.model.path).expanduser()
    missing = local_dir_problem(cfg.model.path, "model.path", ("config.json",))
    if missing:
        fix = (
            "point model.path at the local directory `save_pretrained` (or `huggingface-cli download`) wrote."
        )
        return fail(name, missing, fix), None
    try:
        hf = load_hf_config(cfg)
        shape = model_shape(hf, count_params(hf))
    except Exception as err:  # transformers raises many kinds for a config it cannot read
        return fail(
            name,
            f"model.path={cfg.model.path!r}: the config does not load ({type(err).__name__}: {err})",
            "use a transformers causal-LM checkpoint (or model.trust_remote_code=true).",
        ), None
    weights = sorted(p.name for p in path.glob("*.safetensors")) or sorted(p.name for p in path.glob("*.bin"))
    detail = (
        f"{getattr(hf, 'model_type', '?')}, {shape.params / 1e6:,.1f}M parameters, {shape.layers} layers, "
        f"hidden {shape.hidden}, vocab {shape.vocab}"
    )
    if shape.experts:
        detail += (
            f"; mixture of experts: {shape.active_params / 1e6:,.1f}M active a token "
            f"({shape.experts_per_token} of {shape.experts} experts)"
        )
    if not weights:
        return warn(
            name, detail + "; no weight files", "copy the *.safetensors files next to config.json."
        ), shape
    return ok(name, detail, params=shape.params, model_type=getattr(hf, "model_type", None)), shape


def local_dir_problem(path: str, field: str, files: tuple[str, ...], any_of: bool = False) -> str | None:
    """What is wrong with local checkpoint directory `path` (named by `field`) for holding `files` (all, or
    one of them with `any_of`), or None. Checked before transformers sees the path: it would take a path that
    does not exist for a hub id."""
    p = Path(path).expanduser()
    where = f"{field}={path!r}"
    if not p.exists():
        return f"{where}: no such directory (looked at {p.resolve()})"
    if not p.is_dir():
        return f"{where} is a file, not a checkpoint directory"
    present = [f for f in files if (p / f).is_file()]
    if (any_of and not present) or (not any_of and len(present) < len(files)):
        lacking = " or ".join(files) if any_of else ", ".join(f for f in files if f not in present)
        return f"{where} has no {lacking}"
    return None


def uses_chat(cfg: RunConfig) -> bool:
    """Whether prompts go through the chat template: message-list rows, data.chat_template or an
    environment."""
    if isinstance(cfg.rollout.source, EnvSourceConfig) or cfg.data.chat_template:
        return True
    return any(isinstance(r.get("prompt"), list) for r in train_rows(cfg))


def train_rows(cfg: RunConfig) -> list[dict[str, Any]]:
    if not cfg.data.train_path or not Path(cfg.data.train_path).is_file():
        return []

    try:
        return load_rows(cfg.data.train_path)
    except Exception:  # the run's own data checks report bad files; here they only inform the chat check
        return []


def check_tokenizer(cfg: RunConfig) -> CheckResult:
    name = "tokenizer"
    path = cfg.model.tokenizer_path or cfg.model.path
    if not path:
        return skipped(name, "model.path is not set")
    from ascent.models.loading import TOKENIZER_FILES  # deferred: it imports torch

    field = "model.tokenizer_path" if cfg.model.tokenizer_path else "model.path"
    missing = local_dir_problem(path, field, TOKENIZER_FILES, any_of=True)
    if missing:
        return fail(name, missing, f"point {field} at the local directory `tokenizer.save_pretrained` wrote.")
    try:
        from transformers import AutoTokenizer  # deferred: transformers, slow to import

        tok = AutoTokenizer.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=cfg.model.trust_remote_code
        )
    except Exception as err:  # missing files, bad JSON, unknown class
        return fail(
            name,
            f"{path}: the tokenizer does not load ({type(err).__name__}: {err})",
            "point model.tokenizer_path (or model.path) at the directory `tokenizer.save_pretrained` wrote.",
        )
    if tok.eos_token is None:
        return fail(
            name, f"{path}: no EOS token", "set `eos_token` in tokenizer_config.json: responses never end."
        )
    if uses_chat(cfg) and not getattr(tok, "chat_template", None):
        return fail(
            name,
            f"{path}: no chat template, but prompts go through it (message lists, "
            "data.chat_template=true or an env rollout.source)",
            "use a chat/instruct tokenizer, or set data.chat_template=false for string prompts.",
        )
    if tok.pad_token is None:
        return warn(
            name,
            f"EOS {tok.eos_token!r}, no pad token (EOS pads)",
            "set `pad_token` in tokenizer_config.json to silence the warning.",
        )
    chat = "chat template" if getattr(tok, "chat_template", None) else "no chat template (not needed)"
    return ok(name, f"pad {tok.pad_token!r}, EOS {tok.eos_token!r}, {chat}")


def check_engine_architecture(cfg: RunConfig) -> CheckResult:
    name = "fast engine architecture"
    if cfg.rollout.engine != "fast":
        return skipped(name, f"rollout.engine={cfg.rollout.engine}")
    # deferred: torch; doctor imports without it
    from ascent.rollout.fast.spec import STATIC_ROPE_TYPES, spec_from_config, supported_model_types

    try:
        hf = load_hf_config(cfg)
        spec = spec_from_config(hf)
    except ValueError as err:
        return fail(name, str(err), "set rollout.engine=reference for this model.")
    except Exception as err:  # the model check reports configs that do not load
        return skipped(name, f"the model config does not load ({type(err).__name__})")
    text = getattr(hf, "text_config", None) or hf  # a vision-language model's decoder holds its RoPE
    rope = dict(getattr(text, "rope_parameters", None) or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in STATIC_ROPE_TYPES:
        return fail(
            name,
            f"rope type {rope_type!r} is not one the engine supports ({list(STATIC_ROPE_TYPES)})",
            "set rollout.engine=reference for this model.",
        )
    tp = cfg.rollout.tensor_parallel
    if tp > 1:
        from ascent.rollout.fast.tp_shard import check_shardable  # deferred: torch, as above

        try:
            check_shardable(spec, tp)
        except ValueError as err:
            sizes = f"{spec.num_heads} heads" + (
                f" and the experts' {spec.moe_intermediate_size} features" if spec.is_moe else ""
            )
            return fail(name, str(err), f"set rollout.tensor_parallel to a divisor of the {sizes}.")
    split = f", split over {tp} ranks" if tp > 1 else ""
    return ok(name, f"{spec.model_type} is supported ({', '.join(supported_model_types())}){split}")


def env_names(cfg: RunConfig) -> list[str]:
    """The env source's environment and every distinct `env` column value of the training rows."""
    source = cfg.rollout.source
    if not isinstance(source, EnvSourceConfig):
        return []
    names = [source.env]
    for row in train_rows(cfg):
        env = row.get("env")
        if isinstance(env, str) and env not in names:
            names.append(env)
    return names


def renders(name: str) -> bool:
    """Whether environment `name` (registered or pkg.module:Class) sets `needs_rendering = True` on its
    class."""

    factory: Any = ENVIRONMENTS.get(name)
    if factory is None and ":" in name:
        factory = load_plugin(name, "rollout.source.env")
    if factory is None:
        return False
    target = factory if isinstance(factory, type) else make_env(name)
    return bool(getattr(target, "needs_rendering", False))


def simulator_envs(cfg: RunConfig) -> list[str]:
    """The config's environments that are simulators (their class sets `simulator = True`: `gym`)."""
    out = []
    for name in env_names(cfg):
        try:
            if getattr(make_env(name), "simulator", False):
                out.append(name)
        except Exception:  # noqa: BLE001 - one that does not load is rendering_envs' failure to report
            continue
    return out


def rendering_envs(cfg: RunConfig) -> tuple[list[str], CheckResult | None]:
    """-> (environments that render, a failure when one does not load)."""
    out = []
    for name in env_names(cfg):
        try:
            if renders(name):
                out.append(name)
        except PluginError as err:  # an import path that does not resolve: the run would fail the same way
            return out, fail(
                "environment", str(err), "fix rollout.source.env (a registered name or pkg.module:Class)."
            )
        except Exception as err:  # the environment's constructor raised
            return out, fail(
                "environment",
                f"env {name!r} does not load ({type(err).__name__}: {err})",
                "fix rollout.source.env (a registered name or pkg.module:Class).",
            )
    return out, None
