"""Typed run configuration: pydantic schema, YAML + dotted overrides, readable validation errors.

    from ascent.config import load_config, RunConfig
    cfg = load_config("run.yaml", ["train.lr=1e-5"])          # raises ConfigError on any problem

Imports without torch, so `ascent --help` and `ascent config show` start fast.
"""

from __future__ import annotations

from ascent.config.errors import ConfigError
from ascent.config.loader import (
    apply_overrides,
    dump_config,
    load_config,
    parse_override,
    parse_yaml,
    read_yaml,
    validate_config,
    write_resolved_config,
)
from ascent.config.schema import (
    AlgorithmConfig,
    CheckpointConfig,
    ClusterConfig,
    DataConfig,
    LoraConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    SFTConfig,
    TrackingConfig,
    TrainConfig,
)

__all__ = [
    "AlgorithmConfig",
    "CheckpointConfig",
    "ClusterConfig",
    "ConfigError",
    "DataConfig",
    "LoraConfig",
    "ModelConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "SFTConfig",
    "TrackingConfig",
    "TrainConfig",
    "apply_overrides",
    "dump_config",
    "load_config",
    "parse_override",
    "parse_yaml",
    "read_yaml",
    "validate_config",
    "write_resolved_config",
]
