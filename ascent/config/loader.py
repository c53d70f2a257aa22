"""Load a run configuration: a YAML file, then dotted `key=value` overrides, then validation.

    cfg = load_config("run.yaml", ["rollout.samples_per_prompt=8", "data.val_path=null"])

Rules a user can rely on:
- The file may be omitted (`path=None`): every field takes its default. An empty section (`model:` with
  nothing under it) also means defaults.
- Overrides apply left to right after the file; the last one for a key wins. The key is a dotted path
  (`train.lr`, `reward.kwargs.tolerance`); the value is read as YAML (`8`, `1e-5`, `null`, `true`,
  `[1, 2]`, `{a: 1}`), except that fields typed as text keep the text as written (`run_dir=2024`).
  A value replaces what was at that key: `model.lora={rank: 8}` resets the other lora fields to defaults.
  A choice written as a name (`algorithm.policy_loss: gspo`) takes overrides of its settings as well
  (`algorithm.policy_loss.gspo_clip_low=1e-3`), and so does the older flat key (`algorithm.gspo_clip_low`).
  A choice's bare name as the value (`algorithm.policy_loss=gspo`) sets the name only: the settings given
  before it stay (the file's `{name: gspo, gspo_clip_low: 1e-3}` keeps its 1e-3; settings of another
  choice are then refused, naming the choice that reads them).
- Numbers like `1e-5` are floats (plain PyYAML reads them as strings), in files and overrides alike.
- Duplicate keys in a file are an error (plain PyYAML silently keeps the last one).
- Relative paths (model.path, data.train_path, run_dir, ...) are kept as written and so are relative to
  the current working directory, as with any other command-line tool; they are not rebased on the
  YAML file's directory.

`dump_config` writes the resolved config back as YAML in schema order; `write_resolved_config` stores it
as `<run_dir>/config.yaml`, which `load_config` reads back to the same config.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from ascent.config.errors import ConfigError, from_validation_error, show_value
from ascent.config.fields import choice_members, field_at, is_section, is_text
from ascent.config.schema import RunConfig

ConfigT = TypeVar("ConfigT", bound=BaseModel)

# YAML 1.1 float syntax that also accepts exponents without a dot (`1e-5`, `3E8`).
_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)


class ConfigYamlLoader(yaml.SafeLoader):
    """SafeLoader that reads `1e-5` as a float and rejects duplicate keys."""


class ConfigYamlDumper(yaml.SafeDumper):
    """SafeDumper that quotes strings the loader above would read as floats (e.g. '1e-5')."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping",
                node.start_mark,
                f"found duplicate key {key!r}",
                key_node.start_mark,
            )
    return loader.construct_mapping(node, deep=True)


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    """Lists of scalars on one line (`[1, 2]`), anything nested in block style."""
    flat = all(not isinstance(v, dict | list) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flat)


for _cls in (ConfigYamlLoader, ConfigYamlDumper):
    _cls.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
ConfigYamlLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
ConfigYamlDumper.add_representer(list, _represent_list)


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    schema: type[ConfigT] = RunConfig,  # type: ignore[assignment]
) -> ConfigT:
    """Read `path` (None: defaults only), apply `overrides`, validate against `schema`.

    Raises ConfigError naming every problem: missing or malformed file, bad override, unknown key,
    bad value, broken cross-field rule.
    """
    data = read_yaml(path) if path is not None else {}
    data = apply_overrides(data, overrides, schema)
    return validate_config(data, schema)


def validate_config(
    data: dict[str, Any],
    schema: type[ConfigT] = RunConfig,  # type: ignore[assignment]
) -> ConfigT:
    """Build `schema` from a plain nested dict, turning validation errors into a ConfigError."""
    try:
        return schema.model_validate(_drop_empty_sections(data, schema))
    except ValidationError as exc:
        raise from_validation_error(exc, schema) from exc


def read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The mapping in a YAML file ({} for an empty file); ConfigError when it is missing or malformed."""
    file = Path(path)
    if not file.exists():
        raise ConfigError(f"config file '{path}' not found (looked at {file.absolute()}).")
    if not file.is_file():
        raise ConfigError(f"config path '{path}' is not a file; pass a YAML file such as run.yaml.")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file '{path}' is not UTF-8 text ({exc.reason}).") from exc
    return parse_yaml(text, str(path))


def parse_yaml(text: str, source: str) -> dict[str, Any]:
    """The mapping in YAML `text` ({} when empty); ConfigError naming `source` (a file name) when malformed.
    `read_yaml` reads files with it; `ascent studio`'s config editor validates what is typed with it."""
    try:
        data = yaml.load(text, Loader=ConfigYamlLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file '{source}' is not valid YAML: {_yaml_problem(exc)}.") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file '{source}': the top level must be a mapping of fields and sections "
            f"(run_dir: ..., model: ...), not a {type(data).__name__}."
        )
    return data


def apply_overrides(
    data: dict[str, Any], overrides: Sequence[str], schema: type[BaseModel] = RunConfig
) -> dict[str, Any]:
    """A copy of `data` with every `key=value` override applied in order."""
    out = copy.deepcopy(data)
    for text in overrides:
        keys, value = parse_override(text, schema)
        _set_path(out, keys, value, text, schema)
    return out


def parse_override(text: str, schema: type[BaseModel] = RunConfig) -> tuple[list[str], Any]:
    """`'rollout.stop_token_ids=[1,2]'` -> (['rollout', 'stop_token_ids'], [1, 2])."""
    key, sep, raw = text.partition("=")
    if not sep:
        if text.endswith((".yaml", ".yml")):
            raise ConfigError(
                f"'{text}' looks like a second config file; pass one config file, then key=value overrides."
            )
        raise ConfigError(f"override '{text}' has no '='; write it as key=value, e.g. train.lr=1e-5.")
    keys = [k.strip() for k in key.strip().split(".")]
    if not all(keys):
        raise ConfigError(
            f"override '{text}': '{key}' is not a dotted key; write it as section.field=value, e.g. "
            "train.lr=1e-5."
        )
    field = field_at(schema, keys)
    text_field = field is not None and field.path == ".".join(keys) and is_text(field.info.annotation)
    return keys, _parse_value(raw.strip(), text, text_field)


def _parse_value(raw: str, text: str, text_field: bool) -> Any:
    if raw == "":
        return ""
    try:
        value = yaml.load(raw, Loader=ConfigYamlLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"override '{text}': the value is not valid YAML ({_yaml_problem(exc)}); quote text that "
            "holds special characters, e.g. key='a: b'."
        ) from exc
    if text_field and isinstance(value, bool | int | float):
        return raw
    return value


def _set_path(data: dict[str, Any], keys: list[str], value: Any, text: str, schema: type[BaseModel]) -> None:
    node = data
    for i, key in enumerate(keys[:-1]):
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        elif isinstance(child, str) and _is_choice(schema, keys[: i + 1]):
            child = node[key] = {"name": child}  # `policy_loss: gspo`, then `algorithm.policy_loss.x=...`
        elif not isinstance(child, dict):
            where = ".".join(keys[: i + 1])
            raise ConfigError(
                f"override '{text}': {where}={show_value(child)} is a value, not a section, so it has no "
                f"key '{keys[i + 1]}'; set {where}=<value> instead."
            )
        node = child
    current = node.get(keys[-1])
    if isinstance(value, str) and isinstance(current, dict) and _is_choice(schema, keys):
        value = current | {"name": value}  # a bare name keeps the settings given before it
    node[keys[-1]] = value


def _is_choice(schema: type[BaseModel], keys: list[str]) -> bool:
    field = field_at(schema, keys)
    return field is not None and field.path == ".".join(keys) and bool(choice_members(field.info.annotation))


def _drop_empty_sections(data: dict[str, Any], schema: type[BaseModel]) -> dict[str, Any]:
    """Remove sections written as empty (`model:` with nothing below, i.e. null) so they take defaults."""
    out = dict(data)
    for name, info in schema.model_fields.items():
        if not is_section(info.annotation) or name not in out:
            continue
        if out[name] is None:
            del out[name]
        elif isinstance(out[name], dict):
            out[name] = _drop_empty_sections(out[name], info.annotation)
    return out


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return str(exc)
    mark, start = exc.problem_mark, exc.context_mark
    text = f"{exc.problem} (line {mark.line + 1}, column {mark.column + 1})"
    if exc.context:
        where = f" that starts at line {start.line + 1}, column {start.column + 1}" if start else ""
        text += f" {exc.context}{where}"
    return text


def to_plain(cfg: BaseModel) -> dict[str, Any]:
    """The config as nested dicts/lists/scalars in schema order (tuples become lists)."""
    return _listify(cfg.model_dump(mode="python"))


def _listify(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _listify(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_listify(v) for v in obj]
    return obj


def dump_config(cfg: BaseModel) -> str:
    """The full config as YAML, sections in schema order; `load_config` reads it back unchanged."""
    return yaml.dump(
        to_plain(cfg),
        Dumper=ConfigYamlDumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=100,
    )


CONFIG_FILE = "config.yaml"  # the resolved config in a run directory (read back by resume and the studio)


def write_resolved_config(cfg: BaseModel, run_dir: str | os.PathLike[str]) -> Path:
    """Write the resolved config to `<run_dir>/config.yaml` (atomically) and return that path."""
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / CONFIG_FILE
    tmp = out / f".{CONFIG_FILE}.tmp"
    header = "# The resolved configuration of this run; pass this file to the same command to repeat it.\n"
    tmp.write_text(header + dump_config(cfg), encoding="utf-8")
    os.replace(tmp, path)
    return path
