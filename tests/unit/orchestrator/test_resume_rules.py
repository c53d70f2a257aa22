"""Resume's rules: which config changes break an exact continuation, checkpoint integrity, fingerprints."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ascent.config import RunConfig, load_config
from ascent.config.sources import nest_legacy
from ascent.orchestrator import resume as R


def cfg_dict(**changes) -> dict:
    cfg = RunConfig(model={"path": "m"}, data={"train_path": "d.jsonl"})
    data = cfg.model_dump(mode="json")
    for key, value in changes.items():
        node = data
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return data


@pytest.mark.parametrize(
    "key, value",
    [
        ("model.path", "other"),
        ("seed", 5),
        ("rollout.samples_per_prompt", 4),
        ("algorithm.advantage.name", "rloo"),
        ("algorithm.policy_loss.clip_ratio_high", 0.28),
        ("train.lr", 0.5),
        ("data.train_path", "x.jsonl"),
        ("reward.kwargs", {"answer_key": "y"}),
    ],
)
def test_changes_that_break_exactness_are_listed(key, value):
    changes = R.config_changes(cfg_dict(), cfg_dict(**{key: value}))
    assert len(changes) == 1 and changes[0].startswith(f"{key}:"), changes


@pytest.mark.parametrize(
    "key, value",
    [
        ("iterations", 99),
        ("val_every", 3),
        ("tracking.tensorboard", False),
        ("checkpoint.every", 7),
        ("cluster.worker_timeout_s", 5.0),
        ("cluster.num_trainer_workers", 4),
        ("data.val_path", "v.jsonl"),
        ("resume", True),
    ],
)
def test_harmless_changes_pass(key, value):
    assert R.config_changes(cfg_dict(), cfg_dict(**{key: value})) == []


def test_a_config_saved_with_flat_algorithm_settings_compares_in_the_nested_form():
    """Checkpoints written before policy_loss/advantage became choices saved `policy_loss: ppo` next to every
    loss's and estimator's settings; the settings the choice read compare, the others do not count."""
    flat = cfg_dict()
    algorithm = flat["algorithm"]
    for field in ("policy_loss", "advantage"):
        choice = algorithm.pop(field)
        algorithm[field] = choice.pop("name")
        algorithm |= choice
    algorithm |= {"gspo_clip_low": 0.01, "gamma": 0.9, "lam": 0.5}  # read by no chosen choice
    assert R.config_changes(flat, cfg_dict()) == []
    algorithm["clip_ratio_high"] = 0.28
    assert R.config_changes(flat, cfg_dict()) == ["algorithm.policy_loss.clip_ratio_high: 0.28 -> 0.2"]
    switched = cfg_dict(
        **{"algorithm.advantage": {"name": "gae", "gamma": 1.0, "lam": 1.0, "gae_whiten": True}}
    )
    assert R.config_changes(cfg_dict(), switched) == ["algorithm.advantage.name: 'grpo' -> 'gae'"]


def flat_algorithm(cfg: dict) -> dict:
    """`cfg` as versions before the choices saved it: the choices' names, every member's settings flat."""
    from ascent.config.choices import CHOICE_FIELDS

    algorithm = cfg["algorithm"]
    for field, (choices, _) in CHOICE_FIELDS.items():
        algorithm[field] = algorithm[field]["name"]
        for member in choices.values():
            algorithm |= {
                k: i.default for k, i in member.model_fields.items() if k not in algorithm | {"name": 0}
            }
    return cfg


def test_a_run_resumed_with_an_older_run_dirs_config_yaml_is_the_same_run(tmp_path):
    """The old config.yaml (every setting flat, `lam: 0.95` that grpo never read) loads, and compares equal
    to the checkpoint's saved config, which is the same flat mapping."""
    import yaml

    from ascent.config import load_config

    saved = flat_algorithm(cfg_dict())
    saved["algorithm"] |= {"lam": 0.95, "gspo_clip_low": 0.001, "clip_ratio_high": 0.28}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    cfg = load_config(tmp_path / "config.yaml")
    assert cfg.algorithm.policy_loss.clip_ratio_high == 0.28
    defaults = RunConfig().model_dump(mode="json")
    assert R.config_changes(saved, cfg.model_dump(mode="json"), defaults) == []


def test_a_setting_an_old_checkpoint_lacks_defaults_to_its_own_choices_value():
    """An old sapo run saved without `sapo_tau_pos` ran with SapoLoss's default, not with the default
    member's (ppo has no such setting), so the same value now is no change."""
    sapo = {"name": "sapo", "sapo_tau_pos": 1.0, "sapo_tau_neg": 1.05}
    new = cfg_dict(**{"algorithm.policy_loss": sapo})
    saved = cfg_dict(**{"algorithm.policy_loss": {"name": "sapo", "sapo_tau_neg": 1.05}})
    defaults = RunConfig().model_dump(mode="json")
    assert R.config_changes(saved, new, defaults) == []
    new["algorithm"]["policy_loss"]["sapo_tau_pos"] = 2.0
    assert R.config_changes(saved, new, defaults) == ["algorithm.policy_loss.sapo_tau_pos: '(absent)' -> 2.0"]


def test_check_same_run_refuses_unless_accepted(tmp_path):
    state = {"config": cfg_dict()}
    with pytest.raises(R.ResumeError, match=r"train\.lr.*--accept-changes"):
        R.check_same_run(state, cfg_dict(**{"train.lr": 0.1}), accept=False, where=tmp_path)
    R.check_same_run(state, cfg_dict(**{"train.lr": 0.1}), accept=True, where=tmp_path)


def test_iterations_below_the_checkpoint_are_refused(tmp_path):
    R.check_iterations(5, 5, "iterations=5", tmp_path / "iter_000005")
    with pytest.raises(R.ResumeError, match="iterations=4.*already at 5"):
        R.check_iterations(5, 4, "iterations=4", tmp_path / "iter_000005")


def test_fingerprint_sees_other_contents_of_the_same_size(tmp_path):
    f = tmp_path / "w.safetensors"
    save_file({"w": torch.zeros(4)}, str(f))
    before = R.fingerprint(tmp_path)
    save_file({"w": torch.ones(4)}, str(f))
    assert R.fingerprint(tmp_path) != before
    assert R.fingerprint(tmp_path) == R.fingerprint(tmp_path)


def make_checkpoint(path: Path, iteration: int) -> Path:
    path.mkdir(parents=True)
    save_file({"w": torch.arange(1000, dtype=torch.float32)}, str(path / "model.safetensors"))
    torch.save({"x": torch.ones(3)}, path / "trainer_state.pt")
    (path / "state.json").write_text(json.dumps({"iteration": iteration, "config": {}, "sampler": {}}))
    return path


def test_verify_accepts_a_whole_checkpoint_and_names_each_kind_of_damage(tmp_path):
    root = tmp_path / "checkpoints"
    old, new = make_checkpoint(root / "iter_000001", 1), make_checkpoint(root / "iter_000002", 2)
    assert R.pick_checkpoint([old, new], None) == new
    weights = new / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(R.ResumeError, match=r"model\.safetensors is truncated.*--resume-from iter_000001"):
        R.pick_checkpoint([old, new], None)
    assert R.pick_checkpoint([old, new], "iter_000001") == old
    (old / "trainer_state.pt").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(R.ResumeError, match=r"trainer_state\.pt.*no earlier checkpoint"):
        R.verify_checkpoint(old, [])
    assert zipfile.is_zipfile(new / "trainer_state.pt")


def test_unreadable_state_json_and_unknown_resume_from(tmp_path):
    ckpt = make_checkpoint(tmp_path / "checkpoints" / "iter_000003", 3)
    (ckpt / "state.json").write_text('{"iteration": ')
    with pytest.raises(R.ResumeError, match=r"state\.json is unreadable"):
        R.verify_checkpoint(ckpt)
    with pytest.raises(R.ResumeError, match="iter_000009.*iter_000003"):
        R.pick_checkpoint([ckpt], "iter_000009")


def test_a_state_json_without_its_keys_is_damaged(tmp_path):
    old = make_checkpoint(tmp_path / "checkpoints" / "iter_000002", 2)
    ckpt = make_checkpoint(tmp_path / "checkpoints" / "iter_000003", 3)
    (ckpt / "state.json").write_text('{"iteration": 3}')
    with pytest.raises(
        R.ResumeError, match=r"state\.json is incomplete: it lacks 'config' and 'sampler'.*iter_000002"
    ):
        R.pick_checkpoint([old, ckpt], None)
    (ckpt / "state.json").write_text('{"iteration": 3, "config": {}, "sampler": [1]}')
    with pytest.raises(R.ResumeError, match=r"'sampler' should be an object"):
        R.verify_checkpoint(ckpt)


def test_fields_newer_than_the_checkpoint_count_as_unchanged_at_their_default() -> None:
    """A checkpoint saved before a field existed resumes when the field holds its default; not otherwise."""
    saved = cfg_dict()
    del saved["rollout"]["max_staleness"]
    defaults = RunConfig().model_dump(mode="json")
    assert R.config_changes(saved, cfg_dict(), defaults) == []
    assert R.config_changes(saved, cfg_dict(**{"rollout.max_staleness": 2}), defaults) == [
        "rollout.max_staleness: '(absent)' -> 2"
    ]


def test_an_older_checkpoints_flat_fields_compare_as_their_source() -> None:
    old = RunConfig().model_dump(mode="json")
    flat = {k: v for k, v in old["rollout"].items() if k != "source"}
    flat |= {"env": "guess_number", "agent": None, "agent_timeout_s": 300.0, "agent_concurrency": 32}
    flat |= {"max_turns": 3, "max_episode_tokens": 512}
    nested, found = nest_legacy(flat)
    assert nested["source"] == {
        "name": "env",
        "env": "guess_number",
        "max_turns": 3,
        "max_episode_tokens": 512,
    }
    assert set(found) == {
        "env",
        "agent",
        "agent_timeout_s",
        "agent_concurrency",
        "max_turns",
        "max_episode_tokens",
    }
    new = load_config(None, ["rollout.source={name: env, env: guess_number, max_turns: 3}"])
    assert R.config_changes(old | {"rollout": flat}, new.model_dump(mode="json")) == []
    other = load_config(None, ["rollout.source={name: env, env: guess_number, max_turns: 4}"])
    assert R.config_changes(old | {"rollout": flat}, other.model_dump(mode="json")) == [
        "rollout.source.max_turns: 3 -> 4"
    ]


def test_an_env_source_setting_newer_than_the_checkpoint_compares_as_its_default() -> None:
    new = load_config(None, ["rollout.source={name: env, env: guess_number}"]).model_dump(mode="json")
    saved = json.loads(json.dumps(new))
    del saved["rollout"]["source"]["sims_per_worker"]  # a checkpoint from before the setting
    assert R.config_changes(saved, new) == []
    more = load_config(None, ["rollout.source={name: env, env: guess_number, sims_per_worker: 8}"])
    assert R.config_changes(saved, more.model_dump(mode="json")) == [
        "rollout.source.sims_per_worker: '(absent)' -> 8"
    ]


def test_an_sft_checkpoint_is_not_resumed_by_rl_nor_the_reverse(tmp_path):
    ckpt = make_checkpoint(tmp_path / "sft" / "checkpoints" / "iter_000001", 1)
    sft, rl = {"config": {"epochs": 1.0}}, {"config": {"iterations": 3, "algorithm": {}}}
    R.check_kind(sft, "SFT", ckpt)
    R.check_kind(rl, "RL", ckpt)
    R.check_kind({"config": {}}, "RL", ckpt)  # neither's fields: not told apart, not refused
    with pytest.raises(R.ResumeError, match=r"is an SFT checkpoint.*model\.path=.*sft/final"):
        R.check_kind(sft, "RL", ckpt)
    with pytest.raises(R.ResumeError, match="is an RL checkpoint.*ascent sft resumes only"):
        R.check_kind(rl, "SFT", ckpt)
