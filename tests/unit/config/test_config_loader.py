"""Loading: YAML file + dotted overrides, YAML value semantics, file errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from ascent.config import ConfigError, RunConfig, SFTConfig, apply_overrides, load_config, parse_override


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_no_file_gives_defaults() -> None:
    assert load_config(None, []) == RunConfig()
    assert load_config(None, [], schema=SFTConfig) == SFTConfig()


@pytest.mark.parametrize(
    ("text", "keys", "value"),
    [
        ("rollout.samples_per_prompt=8", ["rollout", "samples_per_prompt"], 8),
        ("train.lr=1e-5", ["train", "lr"], 1e-5),
        ("train.lr=3E-6", ["train", "lr"], 3e-6),
        ("train.lr=0.5", ["train", "lr"], 0.5),
        ("data.val_path=null", ["data", "val_path"], None),
        ("data.val_path=~", ["data", "val_path"], None),
        ("resume=true", ["resume"], True),
        ("resume=False", ["resume"], False),
        ("rollout.stop_token_ids=[1,2]", ["rollout", "stop_token_ids"], [1, 2]),
        (
            "rollout.stop_strings=['</answer>', '\\n\\n']",
            ["rollout", "stop_strings"],
            ["</answer>", "\\n\\n"],
        ),
        (
            "reward.kwargs={tolerance: 0.01, mode: strict}",
            ["reward", "kwargs"],
            {"tolerance": 0.01, "mode": "strict"},
        ),
        ("reward.kwargs.tolerance=1e-3", ["reward", "kwargs", "tolerance"], 1e-3),
        ("reward.fn=mypkg.rewards:score", ["reward", "fn"], "mypkg.rewards:score"),
        ("reward.kwargs.expr=a=b", ["reward", "kwargs", "expr"], "a=b"),
        (" train.lr = 2 ", ["train", "lr"], 2),
    ],
)
def test_parse_override(text: str, keys: list[str], value: object) -> None:
    assert parse_override(text) == (keys, value)


def test_text_fields_keep_the_text_as_written() -> None:
    assert parse_override("run_dir=2024") == (["run_dir"], "2024")
    assert parse_override("tracking.wandb_project=1e-5") == (["tracking", "wandb_project"], "1e-5")
    assert parse_override("tracking.wandb_project=null") == (["tracking", "wandb_project"], None)
    assert parse_override("model.path=") == (["model", "path"], "")
    assert parse_override("model.path='quoted dir'") == (["model", "path"], "quoted dir")
    assert parse_override("model.path=models/on") == (["model", "path"], "models/on")


def test_overrides_apply_in_order_to_a_copy() -> None:
    data = {"train": {"lr": 1.0}}
    out = apply_overrides(data, ["train.lr=2", "train.lr=3", "model.lora.rank=4"])
    assert out == {"train": {"lr": 3}, "model": {"lora": {"rank": 4}}}
    assert data == {"train": {"lr": 1.0}}


def test_load_file_then_overrides(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "run_dir: runs/x\nmodel:\n  path: models/tiny\ntrain:\n  lr: 1e-5\n  betas: [0.9, 0.95]\n"
        "rollout:\n  samples_per_prompt: 4\n  prompts_per_step: 4\n",
    )
    cfg = load_config(
        path, ["rollout.samples_per_prompt=8", "train.trajectories_per_update=32", "data.val_path=val.jsonl"]
    )
    assert cfg.run_dir == "runs/x"
    assert cfg.model.path == "models/tiny"  # relative paths stay as written (relative to the CWD)
    assert cfg.train.lr == pytest.approx(1e-5) and isinstance(cfg.train.lr, float)
    assert cfg.train.betas == (0.9, 0.95)
    assert cfg.rollout.samples_per_prompt == 8
    assert cfg.data.val_path == "val.jsonl"


def test_sft_schema(tmp_path: Path) -> None:
    cfg = load_config(
        write(tmp_path, "epochs: 2\nbatch_size: 4\n"), ["train.lr=3e-5", "resume=true"], SFTConfig
    )
    assert (cfg.epochs, cfg.batch_size, cfg.train.lr, cfg.resume) == (2.0, 4, 3e-5, True)


def test_empty_file_and_empty_sections_mean_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, ""), []) == RunConfig()
    assert load_config(write(tmp_path, "# only a comment\n"), []) == RunConfig()
    cfg = load_config(write(tmp_path, "model:\n  # path: later\ntrain:\n"), ["model.path=m"])
    assert cfg.model.path == "m" and cfg.train == RunConfig().train


def test_section_override_replaces_the_whole_section() -> None:
    cfg = load_config(None, ["model.lora.alpha=8", "model.lora={rank: 4}"])
    assert cfg.model.lora.rank == 4 and cfg.model.lora.alpha == 16.0


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config file '.*nope.yaml' not found"):
        load_config(tmp_path / "nope.yaml", [])


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a file"):
        load_config(tmp_path, [])


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"not valid YAML: .*line 2"):
        load_config(write(tmp_path, "train:\n  lr: [1\n"), [])


def test_duplicate_keys_are_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="duplicate key 'lr'"):
        load_config(write(tmp_path, "train:\n  lr: 1\n  lr: 2\n"), [])


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(write(tmp_path, "- a\n- b\n"), [])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("foo", "override 'foo' has no '='; write it as key=value"),
        ("other.yaml", "looks like a second config file"),
        ("=3", "is not a dotted key"),
        ("train..lr=3", "is not a dotted key"),
        ("rollout.stop_token_ids=[1,2", "the value is not valid YAML"),
        ("train.lr.x=1", None),
    ],
)
def test_bad_override_syntax(override: str, message: str | None) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    if message:
        assert message in str(info.value)


def test_override_below_a_value_is_explained() -> None:
    with pytest.raises(ConfigError, match=r"train\.lr=3 is a value, not a section"):
        load_config(None, ["train.lr=3", "train.lr.x=1"])
